/**
 * Turns a raw credential into the principal it stands for (spec doc 1 section 5). Anything that
 * is not a live credential answers the same 401; a disabled account answers 403.
 */
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { ApiKey, Group, Membership, Session, User } from "../entities/index.ts";
import { credentialKind, hashCredential } from "./credentials.ts";
import { extendedIdle, isSessionKind, sessionState } from "./sessions.ts";

export interface PrincipalData {
  kind: "api_key" | "session";
  id: string;
  scope: string;
  keyGroup: string;
  keyKind: string;
  user: (User & { personalGroup: string }) | null;
  memberships: Array<{ groupSlug: string; role: string }>;
  sessionKind: string;
  /** When the gateway must verify again; 0 = only revocation ends it. */
  validUntilMs: number;
}

export async function membershipsOf(em: EntityManager, userId: string): Promise<Array<{ groupSlug: string; role: string }>> {
  const rows = await em.find(Membership, { userId });
  if (rows.length === 0) return [];
  const groups = await em.find(Group, { id: { $in: rows.map((r) => r.groupId) } });
  const slugById = new Map(groups.map((g) => [g.id, g.slug]));
  return rows
    .map((r) => ({ groupSlug: slugById.get(r.groupId) ?? "", role: r.role }))
    .filter((m) => m.groupSlug)
    .sort((a, b) => a.groupSlug.localeCompare(b.groupSlug));
}

export async function verifyCredential(em: EntityManager, raw: string, now = new Date()): Promise<PrincipalData> {
  const kind = credentialKind(raw);
  if (!kind) throw PlatformError.unauthenticated();
  const hash = hashCredential(raw);

  if (kind === "api_key") {
    const key = await em.findOne(ApiKey, { hash, revokedAt: null });
    if (!key) throw PlatformError.unauthenticated();
    key.lastUsedAt = now;
    const group = key.groupId ? await em.findOne(Group, { id: key.groupId }) : null;
    return {
      kind,
      id: key.id,
      scope: key.scope,
      keyGroup: group?.slug ?? "",
      keyKind: key.kind,
      user: null,
      memberships: [],
      sessionKind: "",
      validUntilMs: 0,
    };
  }

  const session = await em.findOne(Session, { tokenHash: hash });
  if (!session || !isSessionKind(session.kind) || sessionState(session, now) !== "live") throw PlatformError.unauthenticated();
  const user = await em.findOne(User, { id: session.userId });
  if (!user) throw PlatformError.unauthenticated();
  if (user.disabled) throw PlatformError.forbidden("This account is disabled.");
  session.lastUsedAt = now;
  session.idleExpiresAt = extendedIdle(session.kind, now, session.absoluteMaxAt);
  const personal = user.personalGroupId ? await em.findOne(Group, { id: user.personalGroupId }) : null;
  return {
    kind,
    id: session.id,
    scope: "",
    keyGroup: "",
    keyKind: "",
    user: Object.assign(user, { personalGroup: personal?.slug ?? "" }),
    memberships: await membershipsOf(em, user.id),
    sessionKind: session.kind,
    validUntilMs: Math.min(session.idleExpiresAt.getTime(), session.absoluteMaxAt.getTime()),
  };
}

/**
 * Records uses the gateway answered from its cache: `last_used_at` for keys, and for sessions
 * also the idle window, which every use extends.
 */
export async function touchCredentials(em: EntityManager, uses: Array<{ kind: string; id: string; usedAt: Date }>): Promise<number> {
  let touched = 0;
  const keyUses = uses.filter((u) => u.kind === "api_key");
  if (keyUses.length) {
    const keys = await em.find(ApiKey, { id: { $in: keyUses.map((u) => u.id) }, revokedAt: null });
    for (const key of keys) {
      const at = new Date(Math.max(...keyUses.filter((u) => u.id === key.id).map((u) => u.usedAt.getTime())));
      if (!key.lastUsedAt || key.lastUsedAt < at) key.lastUsedAt = at;
      touched++;
    }
  }
  const sessionUses = uses.filter((u) => u.kind === "session");
  if (sessionUses.length) {
    const sessions = await em.find(Session, { id: { $in: sessionUses.map((u) => u.id) }, revokedAt: null });
    for (const s of sessions) {
      const at = new Date(Math.max(...sessionUses.filter((u) => u.id === s.id).map((u) => u.usedAt.getTime())));
      if (!isSessionKind(s.kind) || sessionState(s, at) !== "live") continue;
      if (!s.lastUsedAt || s.lastUsedAt < at) s.lastUsedAt = at;
      s.idleExpiresAt = new Date(Math.max(s.idleExpiresAt.getTime(), extendedIdle(s.kind, at, s.absoluteMaxAt).getTime()));
      touched++;
    }
  }
  return touched;
}
