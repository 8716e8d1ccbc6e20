/**
 * The agent's side of the deploy lane: claim (through the admission gates), report progress,
 * complete. The row is locked (SELECT ... FOR UPDATE) for each, so two agents never both claim an
 * action and a redelivered or duplicated work message never runs an action twice: a second claim
 * is dropped (terminal or claimed elsewhere) or resumes on the same host; a second completion is
 * ignored.
 */
import { LockMode } from "@mikro-orm/core";
import { isUuid } from "@platform/bus";
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { APP_LANE_TYPES, HOST_CONCURRENCY, QUEUE_ORDER_WINDOW_MS, WAITING_AHEAD_READ, checkAdmission, type Admission, type AdmissionInput, type DependencyState } from "./admission.ts";
import { advisoryLocks } from "./advisory-locks.ts";
import { validHostId } from "./agents.ts";
import { cascadeToDependents } from "./dependents.ts";
import { announce } from "./events.ts";
import { cancelledErrorMessage, COMPLETION_STATUSES, isCompletionStatus, isTerminal } from "./lifecycle.ts";
import { isPastPointOfNoReturn, marksSwapCommit } from "./point-of-no-return.ts";

const APP_LANE = [...APP_LANE_TYPES];

async function lockAction(em: EntityManager, actionId: string): Promise<Action | null> {
  if (!isUuid(actionId)) return null;
  return em.findOne(Action, { id: actionId }, { lockMode: LockMode.PESSIMISTIC_WRITE });
}

/**
 * What the gates read, in one statement: the dependency's row, an in-progress action of the app
 * lane and a ready one ahead in it, a build in flight a purge waits for, the host's in-flight count and the ready actions ahead in its
 * queue (the last two only for types with a per-host limit). "Ahead" is one order throughout:
 * higher priority, then older, then the smaller id. A claim runs it with the row locked, so every
 * read sees one moment.
 */
const ADMISSION_READS = `select
  (select json_build_object('id', d.id, 'actionType', d.action_type, 'status', d.status) from actions d where d.id = ?::uuid) as dependency,
  (select json_build_object('id', s.id, 'imageTag', s.image_tag, 'actionType', s.action_type) from actions s
    where ?::uuid is not null and ((s.action_type = 'DEPLOY' and s.depends_on is not null) or s.action_type = 'UNDEPLOY')
      and s.group_slug = ? and s.app_name = ? and s.branch = ?
      and s.created_at > ? and s.status in ('in_progress', 'completed', 'failed') and s.id <> ?
    order by s.created_at desc limit 1) as superseded_by,
  (select json_build_object('id', b.id, 'actionType', b.action_type) from actions b
    where ? and b.status = 'in_progress' and b.group_slug = ? and b.app_name = ? and b.branch = ? and b.action_type in (?) and b.id <> ?
    order by b.claimed_at asc limit 1) as busy,
  (select l.id from actions l left join actions ld on ld.id = l.depends_on
    where ? and l.status = 'queued' and l.group_slug = ? and l.app_name = ? and l.branch = ? and l.action_type in (?) and l.id <> ?
      and (l.depends_on is null or ld.status = 'completed')
      and (l.last_admission_check_at > ? or l.dispatched_at > ?)
      and (l.priority > ? or (l.priority = ? and (l.created_at < ? or (l.created_at = ? and l.id < ?))))
    order by l.priority desc, l.created_at, l.id limit 1) as lane_ahead,
  (select c.id from actions c
    where ? and c.status = 'in_progress' and c.action_type = 'BUILD' and c.group_slug = ? and c.app_name = ? and c.branch = ?
    order by c.claimed_at asc limit 1) as build_in_flight,
  (select count(*)::int from actions f where ? and f.status = 'in_progress' and f.claimed_by = ? and f.action_type = ? and f.id <> ?) as in_flight,
  (select coalesce(json_agg(w.id order by w.priority desc, w.created_at, w.id), '[]'::json) from (
    select x.id, x.priority, x.created_at from actions x
      left join actions d on d.id = x.depends_on
    where ? and x.status = 'queued' and x.action_type = ? and x.dispatched_to = ? and x.id <> ?
      and x.last_admission_check_at > ?
      and (x.depends_on is null or d.status = 'completed')
      and (x.priority > ? or (x.priority = ? and (x.created_at < ? or (x.created_at = ? and x.id < ?))))
      and not (x.action_type in (?) and exists (
        select 1 from actions y where y.status = 'in_progress' and y.group_slug = x.group_slug
          and y.app_name = x.app_name and y.branch = x.branch and y.action_type in (?)))
    order by x.priority desc, x.created_at, x.id
    limit ${WAITING_AHEAD_READ}) w) as ahead`;

/** Everything the admission gates look at for `action` on `hostId`, read from the database. */
export async function admissionInput(em: EntityManager, action: Action, hostId: string, now: Date): Promise<AdmissionInput> {
  const lane = APP_LANE_TYPES.has(action.actionType);
  const limited = HOST_CONCURRENCY[action.actionType] !== undefined;
  const purging = action.actionType === "UNDEPLOY" && action.payload?.purge === true;
  const windowStart = new Date(now.getTime() - QUEUE_ORDER_WINDOW_MS);
  const [row] = await em.getConnection().execute<
    {
      dependency: DependencyState | null;
      superseded_by: AdmissionInput["supersededBy"];
      busy: { id: string; actionType: string } | null;
      lane_ahead: string | null;
      build_in_flight: string | null;
      in_flight: number;
      ahead: string[];
    }[]
  >(
    ADMISSION_READS,
    [
      action.dependsOn ?? null,
      action.dependsOn ?? null, action.groupSlug, action.appName, action.branch, action.createdAt, action.id,
      lane, action.groupSlug, action.appName, action.branch, APP_LANE, action.id,
      lane, action.groupSlug, action.appName, action.branch, APP_LANE, action.id,
      windowStart, windowStart,
      action.priority, action.priority, action.createdAt, action.createdAt, action.id,
      purging, action.groupSlug, action.appName, action.branch,
      limited, hostId, action.actionType, action.id,
      limited, action.actionType, hostId, action.id,
      windowStart,
      action.priority, action.priority, action.createdAt, action.createdAt, action.id,
      APP_LANE, APP_LANE,
    ],
    "all",
    em.getTransactionContext(),
  );
  return {
    action,
    hostId,
    dependency: row?.dependency ?? null,
    supersededBy: row?.superseded_by ?? null,
    appLaneBusyWith: row?.busy ?? null,
    appLaneAhead: row?.lane_ahead ?? null,
    buildInFlight: row?.build_in_flight ?? null,
    inFlightOnHost: Number(row?.in_flight ?? 0),
    waitingAhead: row?.ahead ?? [],
    now,
  };
}

export interface ClaimResult {
  claimed: boolean;
  drop: boolean;
  refusalReason: string;
  action: Action | null;
  admission: Admission | null;
}

export async function claimAction(em: EntityManager, actionId: string, hostId: string, now: Date): Promise<ClaimResult> {
  if (!validHostId(hostId)) throw PlatformError.invalid("host_id must be 1-128 letters, digits, '-' or '_' (and not 'any').");
  const action = await lockAction(em, actionId);
  if (!action) return { claimed: false, drop: true, refusalReason: "unknown action", action: null, admission: null };
  if (!isTerminal(action.status) && action.status !== "in_progress") {
    // Gates count in-flight work per host and per app: claims that share one wait for each other.
    const app = `deploy_queue.app.${action.groupSlug}/${action.appName}/${action.branch}`;
    await advisoryLocks(em, [`deploy_queue.host.${hostId}`, ...(APP_LANE_TYPES.has(action.actionType) ? [app] : [])]);
  }
  const admission = checkAdmission(await admissionInput(em, action, hostId, now));

  switch (admission.verdict) {
    case "drop":
      return { claimed: false, drop: true, refusalReason: admission.reason, action, admission };
    case "resume":
      action.progressAt = now;
      return { claimed: true, drop: false, refusalReason: "", action, admission };
    case "abandon":
      action.status = admission.status;
      action.completedAt = now;
      action.errorMessage = admission.reason;
      action.admissionCheckReason = null;
      announce(em, action, now);
      await cascadeToDependents(em, action, admission.status, now);
      return { claimed: false, drop: true, refusalReason: admission.reason, action, admission };
    case "refuse": {
      const changed = action.admissionCheckReason !== admission.reason;
      action.admissionCheckReason = admission.reason;
      action.lastAdmissionCheckAt = now;
      if (changed) announce(em, action, now);
      return { claimed: false, drop: false, refusalReason: admission.reason, action, admission };
    }
    case "admit":
      action.status = "in_progress";
      action.claimedBy = hostId;
      action.claimedAt = now;
      action.progressAt = now;
      // Spec 2.5: the reason is cleared by a successful claim; the check that let it through was made now.
      action.admissionCheckReason = null;
      action.lastAdmissionCheckAt = now;
      if (admission.forced) action.admitForceUsed = true;
      announce(em, action, now);
      return { claimed: true, drop: false, refusalReason: "", action, admission };
  }
}

export interface ProgressReport {
  actionId: string;
  hostId: string;
  phase: string;
  message: string;
  /** A BUILD's commit, once its clone resolved it. */
  commit?: { hash: string; message: string; author: string; committedAt: string };
}

/**
 * Records the agent's phase and answers whether it should stop (cancel requested, or the action
 * is no longer its to run). Past the point of no return a cancel is not passed on.
 */
export async function reportProgress(em: EntityManager, report: ProgressReport, now: Date): Promise<{ cancelRequested: boolean }> {
  const action = await lockAction(em, report.actionId);
  if (!action) throw PlatformError.notFound(`Action '${report.actionId}' not found`);
  if (action.status !== "in_progress" || action.claimedBy !== report.hostId) {
    // A deploy recorded completed past its swap commit while its agent was silent (see orphans.ts)
    // rolls forward: its agent, heard from again, is told to go on, not to undo the flip.
    const rolledForward = action.status === "completed" && !!action.swapCommittedAt && action.claimedBy === report.hostId;
    return { cancelRequested: !rolledForward };
  }
  action.progressAt = now;
  const phase = report.phase.trim();
  // A cancel that came first wins: the agent stops instead of entering the phase (and before the
  // swap, the swap is never committed).
  if (action.cancelRequested && !isPastPointOfNoReturn(action)) return { cancelRequested: true };
  // An agent resumed after a restart confirms a swap commit the queue may hold already (the
  // action may be draining by now): that phase does not go back.
  const reconfirmed = marksSwapCommit(phase) && !!action.swapCommittedAt;
  const learned = action.actionType === "BUILD" && report.commit?.hash ? learnCommit(action, report.commit) : false;
  if (phase && phase !== action.phase && !reconfirmed) {
    action.phase = phase;
    if (marksSwapCommit(phase) && !action.swapCommittedAt) action.swapCommittedAt = now;
    announce(em, action, now);
  } else if (learned) {
    announce(em, action, now);
  }
  return { cancelRequested: action.cancelRequested && !isPastPointOfNoReturn(action) };
}

/**
 * A running BUILD's commit, shown by its queue row and (through the announced result) its builds
 * row before the build ends; the completion's result replaces it. False when already known.
 */
function learnCommit(action: Action, commit: NonNullable<ProgressReport["commit"]>): boolean {
  if (action.result?.commit_hash === commit.hash) return false;
  action.commitMessage = commit.message || null;
  action.commitAuthor = commit.author || null;
  action.result = {
    ...action.result,
    commit_hash: commit.hash,
    commit_message: commit.message,
    commit_author: commit.author,
    ...(commit.committedAt ? { commit_committed_at: commit.committedAt } : {}),
  };
  return true;
}

export interface Completion {
  actionId: string;
  hostId: string;
  status: string;
  errorMessage: string;
  resultJson: string;
}

function parseResult(json: string): Record<string, unknown> | null {
  if (!json.trim()) return null;
  try {
    const value: unknown = JSON.parse(json);
    return value && typeof value === "object" && !Array.isArray(value) ? (value as Record<string, unknown>) : { value };
  } catch {
    // A completion is never lost to a malformed result; the text is kept as it came.
    return { unparsed: json };
  }
}

const text = (v: unknown) => (typeof v === "string" && v !== "" ? v : null);

/**
 * Finishes an action. Idempotent: a completion of an action that is already terminal is ignored
 * (false); completing an action this host has not claimed is a conflict.
 */
export async function completeAction(em: EntityManager, c: Completion, now: Date): Promise<boolean> {
  if (!isCompletionStatus(c.status)) throw PlatformError.invalid(`status must be one of ${COMPLETION_STATUSES.join(", ")}.`);
  const action = await lockAction(em, c.actionId);
  if (!action) throw PlatformError.notFound(`Action '${c.actionId}' not found`);
  if (isTerminal(action.status)) return false;
  if (action.status !== "in_progress" || action.claimedBy !== c.hostId) {
    throw PlatformError.conflict({
      code: "not_claimed",
      message: `Action ${action.id} is ${action.status === "in_progress" ? `claimed by host ${action.claimedBy}` : action.status}, not claimed by ${c.hostId}.`,
    });
  }
  const result = parseResult(c.resultJson);
  action.status = c.status;
  action.completedAt = now;
  action.progressAt = now;
  action.result = result;
  action.errorMessage =
    c.status === "failed" ? c.errorMessage || "The action failed." : c.status === "cancelled" ? cancelledErrorMessage(c.errorMessage || null, action.cancelReason) : c.errorMessage || null;
  if (result) {
    action.commitMessage = text(result.commit_message) ?? action.commitMessage ?? null;
    action.commitAuthor = text(result.commit_author) ?? action.commitAuthor ?? null;
    if (Array.isArray(result.deploy_warnings)) action.deployWarnings = result.deploy_warnings.filter((w): w is string => typeof w === "string");
  }
  announce(em, action, now);

  if (c.status === "completed" && action.commitMessage) {
    // The deploy of a build shows the commit it ships.
    const dependents = await em.find(Action, { dependsOn: action.id, status: "queued" });
    for (const d of dependents) {
      d.commitMessage ??= action.commitMessage;
      d.commitAuthor ??= action.commitAuthor ?? null;
    }
  } else if (c.status !== "completed") {
    await cascadeToDependents(em, action, c.status, now);
  }
  return true;
}
