/**
 * Cancel (spec doc 1 sections 3.1, 3.2, 4.5). The answer is always a status a client branches on:
 *
 * - `cancelled`: the action was queued and is cancelled outright, with its dependents
 *   (`dependents_cancelled`);
 * - `cancel_requested`: the action is in flight; the agent stops between phases (ReportProgress
 *   answers cancel_requested) and completes it as cancelled. Its queued dependents are cancelled now;
 * - `refused_past_point_of_no_return`: a DEPLOY past its swap commit rolls forward to completed, and a
 *   single-step action in flight (UNDEPLOY, SERVICE_ACTION) finishes
 *   (see point-of-no-return.ts);
 * - `not_cancellable`: already terminal;
 * - `not_found`: unknown, ambiguous or another group's id.
 *
 * A build whose request has not reached the queue yet is cancelled too (`cancelBeforeIntake`).
 */
import { LockMode } from "@mikro-orm/core";
import type { Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { cascadeToDependents } from "./dependents.ts";
import { announce } from "./events.ts";
import { cancelledErrorMessage, FAST_RPC_TYPES, isTerminal, queueStatus } from "./lifecycle.ts";
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
  return cancelLocked(em, action, reason, now);
}

/**
 * An undeploy with purge deletes the branch's builds and their images: a build of the branch not
 * yet ended is cancelled with it (its deploy too), rather than leaving an image and a build the
 * purge has not seen. One in flight stops between phases; the undeploy waits for it (admission 4b).
 */
export async function cancelBuildsOfPurgedBranch(em: EntityManager, target: { groupSlug: string; appName: string; branch: string }, undeployId: string, now: Date): Promise<void> {
  const builds = await em.find(Action, { ...target, actionType: "BUILD", status: { $in: ["queued", "in_progress"] } }, { lockMode: LockMode.PESSIMISTIC_WRITE, orderBy: { createdAt: "asc" } });
  for (const build of builds) await cancelLocked(em, build, `the branch is undeployed with purge (${undeployId}).`, now);
}

async function cancelLocked(em: EntityManager, action: Action, reason: string, now: Date): Promise<CancelOutcome> {
  const outcome = (status: CancelStatus, dependentsCancelled: string[] = []): CancelOutcome => ({
    actionId: action.id,
    status,
    cancelled: action.status === "cancelled",
    // Asked of it in flight, by this call or an earlier one, whatever it has become since.
    cancelRequested: action.cancelRequested,
    queueStatus: queueStatus(action),
    dependentsCancelled,
    appName: action.appName,
  });

  // A fast request (GIT_PREFLIGHT) is asked of an agent at once, outside the lane: nothing to stop.
  if (isTerminal(action.status) || FAST_RPC_TYPES.has(action.actionType)) return outcome("not_cancellable");
  if (action.status === "in_progress" && isPastPointOfNoReturn(action)) return outcome("refused_past_point_of_no_return");

  // A cancel asked again without a reason keeps the one given first.
  action.cancelReason = reason.trim() || action.cancelReason || null;
  if (action.status === "queued") {
    action.status = "cancelled";
    action.completedAt = now;
    action.admissionCheckReason = null;
    action.errorMessage = cancelledErrorMessage(null, action.cancelReason);
    announce(em, action, now);
    return outcome("cancelled", await cascadeToDependents(em, action, "cancelled", now));
  }
  if (!action.cancelRequested) {
    action.cancelRequested = true;
    announce(em, action, now);
  }
  return outcome("cancel_requested", await cascadeToDependents(em, action, "cancelled", now));
}

/** A builds row of apps-builds whose BUILD action the queue does not hold yet. */
export interface UntakenBuild {
  id: string;
  deployActionId: string | null;
  appName: string;
  branch: string;
  groupSlug: string;
  tag: string;
  createdBy: string;
  createdAt: Date;
}

/**
 * Cancel of a build the queue has not taken in yet: POST /api/builds answers 202 before its
 * `build_requested` event reaches intake, and a cancel sent at once used to find nothing while
 * the build went on to run. Its BUILD (and DEPLOY, with auto-deploy) are written here, never
 * dispatched, and cancelled as any queued action is; when the event comes, intake finds the BUILD
 * (it is idempotent on the build id) and adds nothing. Should intake write them first, the insert
 * fails on the unique id and the caller cancels what intake wrote instead.
 */
export async function cancelBeforeIntake(em: EntityManager, caller: Caller, build: UntakenBuild, reason: string, now: Date): Promise<CancelOutcome> {
  if (!canAct(caller, build.groupSlug)) {
    return { actionId: build.id, status: "not_found", cancelled: false, cancelRequested: false, queueStatus: "", dependentsCancelled: [], appName: "" };
  }
  const common = {
    status: "queued",
    groupSlug: build.groupSlug,
    appName: build.appName,
    branch: build.branch,
    imageTag: build.tag,
    autoDeploy: build.deployActionId !== null,
    deployWarnings: [],
    createdBy: build.createdBy,
    createdAt: build.createdAt < now ? build.createdAt : now,
    updatedAt: now,
  };
  const ids = { build_id: build.id, app_name: build.appName, branch: build.branch, group_slug: build.groupSlug };
  em.create(Action, { ...common, id: build.id, actionType: "BUILD", payload: { ...ids, tag: build.tag, auto_deploy: common.autoDeploy } });
  if (build.deployActionId) {
    em.create(Action, { ...common, id: build.deployActionId, actionType: "DEPLOY", dependsOn: build.id, payload: { ...ids, deployment_id: build.deployActionId, image_tag: build.tag } });
  }
  await em.flush();
  return cancelAction(em, caller, build.id, reason, now);
}
