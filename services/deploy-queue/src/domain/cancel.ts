/**
 * Cancel (spec doc 1 sections 3.1, 3.2, 4.5). The answer is always a status a client branches on:
 *
 * - `cancelled`: the action was queued and is cancelled outright, with its dependents
 *   (`dependents_cancelled`);
 * - `cancel_requested`: the action is in flight; the agent stops between phases (ReportProgress
 *   answers cancel_requested) and completes it as cancelled. Its queued dependents are cancelled now;
 * - `refused_past_point_of_no_return`: a DEPLOY past its swap commit rolls forward to completed
 *   (see point-of-no-return.ts);
 * - `not_cancellable`: already terminal;
 * - `not_found`: unknown, ambiguous or another group's id.
 */
import type { Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { cascadeToDependents } from "./dependents.ts";
import { announce } from "./events.ts";
import { FAST_RPC_TYPES, isTerminal, queueStatus } from "./lifecycle.ts";
import { canAct, checkActionIdPrefix, findActionByPrefix } from "./lookup.ts";
import { isPastPointOfNoReturn } from "./point-of-no-return.ts";

export const CANCEL_STATUSES = ["cancelled", "cancel_requested", "refused_past_point_of_no_return", "not_found", "not_cancellable"] as const;
export type CancelStatus = (typeof CANCEL_STATUSES)[number];

export interface CancelOutcome {
  actionId: string;
  status: CancelStatus;
  cancelled: boolean;
  cancelRequested: boolean;
  queueStatus: string;
  dependentsCancelled: string[];
  appName: string;
}

export async function cancelAction(em: EntityManager, caller: Caller, id: string, reason: string, now: Date): Promise<CancelOutcome> {
  const prefix = checkActionIdPrefix(id.trim());
  const action = await findActionByPrefix(em, prefix, (g) => canAct(caller, g), { lock: true });
  if (!action) {
    return { actionId: id, status: "not_found", cancelled: false, cancelRequested: false, queueStatus: "", dependentsCancelled: [], appName: "" };
  }
  const outcome = (status: CancelStatus, dependentsCancelled: string[] = []): CancelOutcome => ({
    actionId: action.id,
    status,
    cancelled: action.status === "cancelled",
    cancelRequested: action.cancelRequested && action.status === "in_progress",
    queueStatus: queueStatus(action),
    dependentsCancelled,
    appName: action.appName,
  });

  // A fast request (GIT_PREFLIGHT) is asked of an agent at once, outside the lane: nothing to stop.
  if (isTerminal(action.status) || FAST_RPC_TYPES.has(action.actionType)) return outcome("not_cancellable");
  if (action.status === "in_progress" && isPastPointOfNoReturn(action)) return outcome("refused_past_point_of_no_return");

  action.cancelReason = reason.trim() || null;
  if (action.status === "queued") {
    action.status = "cancelled";
    action.completedAt = now;
    action.admissionCheckReason = null;
    announce(em, action, now);
    return outcome("cancelled", await cascadeToDependents(em, action, "cancelled", now));
  }
  if (!action.cancelRequested) {
    action.cancelRequested = true;
    announce(em, action, now);
  }
  return outcome("cancel_requested", await cascadeToDependents(em, action, "cancelled", now));
}
