/**
 * Admission override (spec doc 1 section 4.5, admit-force): a single-use grant that lets the
 * agent claim a queued action past the capacity gates (admission.ts) on its next poll. The TTL is
 * clamped to 60-3600 s (default 300); the grant is consumed by the claim it lets through. The
 * caller needs admin scope and must own the action (operators own everything); anything else,
 * including a malformed or too-short id, is the same 404.
 */
import { PlatformError, isIdPrefix } from "@platform/errors";
import { actorOf, hasScope, type Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { FAST_RPC_TYPES } from "./lifecycle.ts";
import { actionNotFound, canAct, findActionByPrefix } from "./lookup.ts";

export const ADMIT_FORCE_TTL = { min: 60, max: 3600, default: 300 } as const;
const MAX_REASON = 500;

/** Missing means the default; any number, 0 included, is clamped into [min, max]. */
export function clampTtl(ttlSeconds: number | null | undefined): number {
  if (ttlSeconds === null || ttlSeconds === undefined || !Number.isFinite(ttlSeconds)) return ADMIT_FORCE_TTL.default;
  return Math.min(ADMIT_FORCE_TTL.max, Math.max(ADMIT_FORCE_TTL.min, Math.round(ttlSeconds)));
}

export interface AdmitForceGrant {
  actionId: string;
  expiresAt: Date;
  ttlSeconds: number;
}

export async function admitForce(em: EntityManager, caller: Caller, id: string, reason: string, ttlSeconds: number | undefined, now: Date): Promise<AdmitForceGrant> {
  if (!caller.platformOperator && !hasScope(caller.scope, "admin")) {
    throw PlatformError.forbidden(`Scope 'admin' required, you have '${caller.scope || "none"}'`);
  }
  const why = reason.trim();
  if (!why) throw PlatformError.invalid("reason is required: say why the action may pass the admission gates.");
  if (why.length > MAX_REASON) throw PlatformError.invalid(`reason must be at most ${MAX_REASON} characters.`);
  const trimmed = id.trim();
  const action = isIdPrefix(trimmed) ? await findActionByPrefix(em, trimmed, (g) => canAct(caller, g), { lock: true }) : null;
  if (!action) throw actionNotFound(id);
  if (FAST_RPC_TYPES.has(action.actionType)) {
    throw PlatformError.badRequest({
      code: "not_gated",
      message: `Action ${action.id} is a ${action.actionType}, a fast request to an agent outside the deploy lane; no admission gate holds it.`,
      status: action.status,
    });
  }
  if (action.status !== "queued") {
    throw PlatformError.badRequest({
      code: "not_queued",
      message: `Action ${action.id} is no longer queued (status: ${action.status}); only a queued action can be admitted.`,
      status: action.status,
    });
  }
  const ttl = clampTtl(ttlSeconds);
  const expiresAt = new Date(now.getTime() + ttl * 1000);
  action.admitForceUntil = expiresAt;
  action.admitForceReason = why;
  action.admitForceBy = actorOf(caller);
  action.admitForceUsed = false;
  return { actionId: action.id, expiresAt, ttlSeconds: ttl };
}
