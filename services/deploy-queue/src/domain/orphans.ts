/**
 * An action whose agent died is not left in_progress forever (deployments issue, recovery): once
 * its claiming agent has been silent (no heartbeat) and the action has had no progress report for
 * ORPHANED_AFTER_MS, it fails with a reason naming the host, and its dependents with it. While it
 * waits, stuck_class says `in_progress` (see stuck.ts).
 *
 * An agent that restarts in time claims its action again and finishes or fails it cleanly itself.
 */
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { LIVE_WINDOW_MS } from "./agents.ts";
import { cascadeToDependents } from "./dependents.ts";
import { announce } from "./events.ts";

export const ORPHANED_AFTER_MS = 3 * 60_000;

export async function failOrphanedActions(em: EntityManager, now: Date): Promise<Action[]> {
  const cutoff = new Date(now.getTime() - ORPHANED_AFTER_MS);
  const rows = await em.getConnection().execute<{ id: string; last_seen: Date | string | null }[]>(
    `select x.id, g.last_seen from actions x
       left join agents g on g.host_id = x.claimed_by
     where x.status = 'in_progress' and coalesce(x.progress_at, x.claimed_at) < ?
       and (g.host_id is null or g.last_seen < ?)
     order by x.claimed_at
     limit 100
     for update of x skip locked`,
    [cutoff, new Date(now.getTime() - LIVE_WINDOW_MS)],
    "all",
    em.getTransactionContext(),
  );
  if (rows.length === 0) return [];
  const seen = new Map(rows.map((r) => [r.id, r.last_seen ? new Date(r.last_seen) : null]));
  const actions = await em.find(Action, { id: { $in: rows.map((r) => r.id) } });
  for (const action of actions) {
    const lastSeen = seen.get(action.id);
    action.status = "failed";
    action.completedAt = now;
    action.errorMessage = `The agent on host ${action.claimedBy} stopped responding during the action (last heard from ${lastSeen ? lastSeen.toISOString() : "never"}); it was failed after ${ORPHANED_AFTER_MS / 60_000} minutes without progress.`;
    announce(em, action, now);
    await cascadeToDependents(em, action, "failed", now);
  }
  return actions;
}
