/**
 * Dependent actions (depends_on): a DEPLOY queued with its BUILD waits for it. When an action
 * ends without completing (failed, cancelled) or its cancel is accepted, its live dependents end
 * with it: cancelling a build cascades to its dependent deploy (spec doc 1 section 3.1).
 */
import { LockMode } from "@mikro-orm/core";
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { announce } from "./events.ts";
import { cancelledErrorMessage } from "./lifecycle.ts";

/**
 * Ends every queued dependent of `parent` (and theirs, transitively) with `status`; returns the
 * ids it ended. A dependent already claimed cannot exist (its claim needs a completed parent).
 */
export async function cascadeToDependents(em: EntityManager, parent: Action, status: "failed" | "cancelled", now: Date): Promise<string[]> {
  const ended: string[] = [];
  const queue: Action[] = [parent];
  const seen = new Set([parent.id]);
  while (queue.length > 0) {
    const current = queue.shift()!;
    const dependents = await em.find(Action, { dependsOn: current.id, status: "queued" }, { lockMode: LockMode.PESSIMISTIC_WRITE, orderBy: { createdAt: "asc" } });
    for (const d of dependents) {
      if (seen.has(d.id)) continue;
      seen.add(d.id);
      d.status = status;
      d.completedAt = now;
      d.admissionCheckReason = null;
      if (status === "cancelled") d.cancelReason = parent.cancelReason ?? null;
      d.errorMessage = status === "cancelled" ? cancelledErrorMessage(endedWith(current, status), d.cancelReason) : endedWith(current, status);
      announce(em, d, now);
      ended.push(d.id);
      queue.push(d);
    }
  }
  return ended;
}

/** Why a dependent ended: a parent still running had its cancel requested, not carried out yet. */
function endedWith(parent: Action, status: "failed" | "cancelled"): string {
  const name = `${parent.actionType} ${parent.id}`;
  if (status === "failed") return `Dependency ${name} failed.`;
  if (parent.status === "in_progress") return `Cancelled with its dependency ${name}, whose cancel was requested while it ran.`;
  return `Dependency ${name} was cancelled.`;
}
