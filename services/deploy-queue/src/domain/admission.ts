/**
 * Admission gates: whether an agent may claim an action now (ARCHITECTURE section 4). Checked in
 * this order, the first that applies decides:
 *
 * 1. terminal: the action already finished; the message is dropped;
 * 2. claimed: claimed by another host (drop), or by this one (a resume after an agent restart);
 * 3. dependency: the action it depends on must have completed; a failed or cancelled dependency
 *    ends this action too (failed or cancelled) and the message is dropped;
 * 3b. superseded: the deploy of a build is cancelled when the deploy of a build asked for after it
 *    has already started on the same app and branch: builds finish out of order (a quick one
 *    after a slow one, an event redelivered late), and the older release must not replace the
 *    newer one. So is it when an undeploy asked for after it has started: the build it waited
 *    for must not bring back what the undeploy took down;
 * 4. app lane: one action that changes what runs (DEPLOY, UNDEPLOY, ...) per app and branch at
 *    a time, so two blue/green swaps of one app never race; and in order: a ready one that goes
 *    before it (higher priority, then older) goes first, so a restart then a stop end stopped
 *    however an agent's claims of them interleave;
 * 4b. purge: an undeploy with purge waits for a build of its branch still in flight (asked to
 *    cancel when the undeploy was queued) to end, so no image or build of the branch outlives it;
 * 5. per-host concurrency: at most HOST_CONCURRENCY[type] actions of a type in flight on a host;
 * 6. queue order: when a host has fewer free slots than ready actions waiting for them, the
 *    higher priority (then the older) goes first.
 *
 * Gates 5 and 6 are the capacity gates an admission override (admit-force) passes, once; the
 * others protect correctness and are never overridden. Every refusal is recorded on the row
 * (admission_check_reason); a claim clears it.
 */
import { isTerminal } from "./lifecycle.ts";

/** In-flight actions of one type a single host runs at once. Types not listed are not limited. */
export const HOST_CONCURRENCY: Readonly<Record<string, number>> = { BUILD: 2, DEPLOY: 2 };

/**
 * Types that change what runs for an app and branch: one at a time per app lane. A route
 * reconcile (a visibility flip) is not one: it runs beside a deploy in flight, so a flip to private
 * takes effect within seconds, and the agent has that deploy read its front doors again before
 * its swap.
 */
export const APP_LANE_TYPES: ReadonlySet<string> = new Set(["DEPLOY", "RETRY", "UNDEPLOY", "PURGE_APP", "RESTORE", "SERVICE_ACTION", "DRIVE_APPLY"]);

/** A waiting action counts for the queue order only if its agent tried it this recently. */
export const QUEUE_ORDER_WINDOW_MS = 30_000;
/** How many of the ready actions ahead in a host's queue the gates read (gate 6 needs only as many as the host has slots). */
export const WAITING_AHEAD_READ = 10;

export interface AdmissionAction {
  id: string;
  status: string;
  actionType: string;
  claimedBy?: string | null;
  dependsOn?: string | null;
  admitForceUntil?: Date | null;
  admitForceUsed: boolean;
}

export interface DependencyState {
  id: string;
  actionType: string;
  status: string;
}

export interface AdmissionInput {
  action: AdmissionAction;
  hostId: string;
  /** The row `dependsOn` names; null when it names nothing or the row is gone. */
  dependency: DependencyState | null;
  /**
   * For the deploy of a build: the deploy of a build or the undeploy requested later, on the same
   * app and branch, that has been claimed (in progress or ended other than cancelled).
   */
  supersededBy: { id: string; imageTag: string | null; actionType: string } | null;
  /** An in-progress action of the same app lane (APP_LANE_TYPES, same group, app and branch). */
  appLaneBusyWith: { id: string; actionType: string } | null;
  /**
   * A ready action of the same app lane (queued, its dependency met) that goes before this one
   * (higher priority, or equal priority and older), dispatched or tried by its agent within
   * QUEUE_ORDER_WINDOW_MS: one whose host has gone quiet holds the lane up no longer than that.
   */
  appLaneAhead: string | null;
  /** For an undeploy with purge: a BUILD of the same app and branch in progress. */
  buildInFlight: string | null;
  /** Actions of the same type in progress on this host (this one excluded). */
  inFlightOnHost: number;
  /**
   * Ready actions of the same type dispatched to this host that go before this one (higher
   * priority, or equal priority and older) and whose agent tried them within QUEUE_ORDER_WINDOW_MS;
   * at most WAITING_AHEAD_READ.
   */
  waitingAhead: string[];
  now: Date;
}

export type Admission =
  | { verdict: "admit"; forced: boolean }
  | { verdict: "resume" }
  | { verdict: "refuse"; reason: string; blockingActionId: string | null }
  | { verdict: "drop"; reason: string }
  | { verdict: "abandon"; status: "failed" | "cancelled"; reason: string };

/** A grant from admit-force that is still valid and unused. */
export function admitForceAvailable(action: Pick<AdmissionAction, "admitForceUntil" | "admitForceUsed">, now: Date): boolean {
  return !action.admitForceUsed && !!action.admitForceUntil && action.admitForceUntil.getTime() > now.getTime();
}

const short = (id: string) => id.slice(0, 8);

export function checkAdmission(input: AdmissionInput): Admission {
  const { action, hostId, dependency, now } = input;

  // 1. terminal
  if (isTerminal(action.status)) return { verdict: "drop", reason: `action is ${action.status}` };

  // 2. claimed
  if (action.status === "in_progress") {
    if (action.claimedBy === hostId) return { verdict: "resume" };
    return { verdict: "drop", reason: `claimed by host ${action.claimedBy ?? "unknown"}` };
  }

  // 3. dependency
  if (action.dependsOn) {
    if (!dependency) {
      return { verdict: "abandon", status: "failed", reason: `Dependency ${action.dependsOn} no longer exists.` };
    }
    if (dependency.status === "failed") {
      return { verdict: "abandon", status: "failed", reason: `Dependency ${dependency.actionType} ${dependency.id} failed.` };
    }
    if (dependency.status === "cancelled") {
      return { verdict: "abandon", status: "cancelled", reason: `Dependency ${dependency.actionType} ${dependency.id} was cancelled.` };
    }
    if (dependency.status !== "completed") {
      return { verdict: "refuse", reason: `waiting for ${dependency.id} (${dependency.status})`, blockingActionId: dependency.id };
    }
  }

  // 3b. superseded
  if (action.dependsOn && input.supersededBy) {
    const newer = input.supersededBy;
    const what =
      newer.actionType === "UNDEPLOY"
        ? `the undeploy ${newer.id} requested after this one`
        : `the deploy ${newer.id} of a build requested after this one${newer.imageTag ? ` (${newer.imageTag})` : ""}`;
    return { verdict: "abandon", status: "cancelled", reason: `Superseded: ${what} has already started.` };
  }

  // 4. app lane
  if (input.appLaneBusyWith && APP_LANE_TYPES.has(action.actionType)) {
    const busy = input.appLaneBusyWith;
    return { verdict: "refuse", reason: `app is busy with ${busy.actionType} ${busy.id} (in_progress)`, blockingActionId: busy.id };
  }
  if (input.appLaneAhead && APP_LANE_TYPES.has(action.actionType)) {
    const ahead = input.appLaneAhead;
    return { verdict: "refuse", reason: `waiting behind ${short(ahead)} (higher priority or older) of the same app and branch`, blockingActionId: ahead };
  }

  // 4b. purge
  if (input.buildInFlight) {
    return { verdict: "refuse", reason: `waiting for build ${short(input.buildInFlight)} of the branch to end: a purge deletes its image and record too`, blockingActionId: input.buildInFlight };
  }

  // 5. per-host concurrency and 6. queue order: the capacity gates admit-force passes once.
  const limit = HOST_CONCURRENCY[action.actionType];
  if (limit !== undefined) {
    const free = limit - input.inFlightOnHost;
    const forced = admitForceAvailable(action, now);
    if (free <= 0) {
      if (forced) return { verdict: "admit", forced: true };
      return {
        verdict: "refuse",
        reason: `host ${hostId} is at its limit of ${limit} ${action.actionType} actions in flight (${input.inFlightOnHost} running)`,
        blockingActionId: null,
      };
    }
    if (input.waitingAhead.length >= free) {
      if (forced) return { verdict: "admit", forced: true };
      // The actions ahead may be other groups': the reason, which the tenant reads, names none of them.
      const ahead = input.waitingAhead.length >= WAITING_AHEAD_READ ? `${WAITING_AHEAD_READ} or more` : String(input.waitingAhead.length);
      return {
        verdict: "refuse",
        reason: `waiting behind ${ahead} ready action(s) (higher priority or older) for a ${action.actionType} slot on host ${hostId}`,
        blockingActionId: input.waitingAhead[0]!,
      };
    }
  }
  return { verdict: "admit", forced: false };
}
