/**
 * An action whose agent died is not left in_progress forever (deployments issue, recovery): once
 * its claiming agent has been silent (no heartbeat) and the action has had no progress report for
 * `afterMs` (ORPHANED_ACTION_AFTER_S), it fails with a reason naming the host, and its dependents with it. While it
 * waits, stuck_class says `in_progress` (see stuck.ts).
 *
 * A deploy past its swap commit is the exception: past the point of no return a deploy rolls
 * forward to completed (spec doc 1 section 3.2), and its agent, when it comes back, finishes the
 * route flip from its host state whatever the queue says. So it is recorded completed, with a
 * warning: the release it ships is the one the app runs (failing it would have the app report the
 * old release as serving, and a scale would redeploy that one).
 *
 * An agent that restarts in time claims its action again and finishes or fails it cleanly itself.
 */
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { LIVE_WINDOW_MS } from "./agents.ts";
import { cascadeToDependents } from "./dependents.ts";
import { announce } from "./events.ts";

/** The wait `afterMs` in words, as the messages say it: "3 minutes", "45 s". */
export function orphanWait(afterMs: number): string {
  const s = Math.round(afterMs / 1000);
  return s % 60 === 0 ? `${s / 60} minute${s === 60 ? "" : "s"}` : `${s} s`;
}

export async function failOrphanedActions(em: EntityManager, now: Date, afterMs: number): Promise<Action[]> {
  const cutoff = new Date(now.getTime() - afterMs);
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
    // Heard from last: its heartbeat or this action's progress report, whichever came later.
    const heartbeat = seen.get(action.id);
    const heard = [heartbeat, action.progressAt].filter((d): d is Date => !!d).sort((a, b) => b.getTime() - a.getTime())[0];
    const silent =
      `The agent on host ${action.claimedBy} stopped responding during the action (last heard from ${heard ? heard.toISOString() : "never"}` +
      `${heartbeat ? "" : "; it never sent a heartbeat"})`;
    action.completedAt = now;
    if (action.swapCommittedAt) {
      action.status = "completed";
      action.errorMessage = null;
      action.deployWarnings = [
        ...(action.deployWarnings ?? []),
        `${silent} after the swap commit; past the point of no return the deploy rolls forward: recorded completed after ${orphanWait(afterMs)} without progress, the route flip is finished by the agent when it is back.`,
      ];
      announce(em, action, now);
      continue;
    }
    action.status = "failed";
    action.errorMessage = `${silent}; it was failed after ${orphanWait(afterMs)} without progress.`;
    announce(em, action, now);
    await cascadeToDependents(em, action, "failed", now);
  }
  return actions;
}
