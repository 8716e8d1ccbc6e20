/**
 * Session lifetime (spec doc 1 section 3.5): an idle window that each use extends, never past
 * an absolute cap of 90 days from sign-in.
 */
const DAY_MS = 24 * 3600 * 1000;

export const SESSION_POLICY = {
  idleMs: { browser: 30 * DAY_MS, cli: DAY_MS },
  absoluteMs: 90 * DAY_MS,
} as const;

export type SessionKind = keyof typeof SESSION_POLICY.idleMs;

export function isSessionKind(kind: string): kind is SessionKind {
  return kind === "browser" || kind === "cli";
}

export interface SessionWindow {
  idleExpiresAt: Date;
  absoluteMaxAt: Date;
}

export function initialWindow(kind: SessionKind, now: Date): SessionWindow {
  const absoluteMaxAt = new Date(now.getTime() + SESSION_POLICY.absoluteMs);
  return { idleExpiresAt: extendedIdle(kind, now, absoluteMaxAt), absoluteMaxAt };
}

/** The idle expiry after a use at `now`: one more idle window, capped by the absolute limit. */
export function extendedIdle(kind: SessionKind, now: Date, absoluteMaxAt: Date): Date {
  return new Date(Math.min(now.getTime() + SESSION_POLICY.idleMs[kind], absoluteMaxAt.getTime()));
}

export type SessionState = "live" | "idle_expired" | "absolute_expired" | "revoked";

export function sessionState(s: SessionWindow & { revokedAt?: Date | null }, now: Date): SessionState {
  if (s.revokedAt) return "revoked";
  if (now.getTime() >= s.absoluteMaxAt.getTime()) return "absolute_expired";
  if (now.getTime() >= s.idleExpiresAt.getTime()) return "idle_expired";
  return "live";
}
