/** A signed-in user's own sessions: listable and revocable (spec doc 1 section 3.5). */
import { PlatformError } from "@platform/errors";
import { audit, enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { actorOf, type Caller } from "@platform/caller";
import { Session } from "../entities/index.ts";
import { sessionState, isSessionKind } from "./sessions.ts";

function requireSessionCaller(caller: Caller): void {
  if (caller.kind !== "session" || !caller.userId) throw PlatformError.forbidden("This route requires a session; API keys have no sessions.");
}

export async function listSessions(em: EntityManager, caller: Caller, now = new Date()): Promise<Session[]> {
  requireSessionCaller(caller);
  const rows = await em.find(Session, { userId: caller.userId, revokedAt: null }, { orderBy: { createdAt: "desc" } });
  return rows.filter((s) => isSessionKind(s.kind) && sessionState(s, now) === "live");
}

export async function revokeSession(em: EntityManager, caller: Caller, id: string): Promise<void> {
  requireSessionCaller(caller);
  const session = /^[0-9a-f-]{36}$/i.test(id) ? await em.findOne(Session, { id, userId: caller.userId }) : null;
  if (!session) throw PlatformError.notFound("Session not found");
  if (session.revokedAt) return;
  session.revokedAt = new Date();
  audit(em, { actor: actorOf(caller), action: "session.revoke", target: session.id });
  enqueueEvent(em, subjects.events.credentialRevoked, { kind: "session", id: session.id });
}
