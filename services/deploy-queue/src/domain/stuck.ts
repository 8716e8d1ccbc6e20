/**
 * stuck_class (spec doc 1 section 2.5), computed on read: why a live action is not moving.
 *
 * - `build_in_progress`: a queued action waits on a dependency (a DEPLOY on its BUILD) that is
 *   still queued or running; the build's own row tells the rest;
 * - `admission_refused`: queued, and the agent's last claim was refused (admission_check_reason);
 * - `never_claimed`: queued for more than 2 minutes and no agent has even tried to claim it;
 * - `in_progress`: claimed, and the agent has reported nothing for more than 2 minutes (a working
 *   agent reports every 20 s), or for as long as its host has been silent (no heartbeat within
 *   the live window): a host known gone is not waited on; after ORPHANED_ACTION_AFTER_S the action is
 *   failed (orphans.ts);
 * - null otherwise (moving normally, or terminal).
 */
import { LIVE_WINDOW_MS, isLive } from "./agents.ts";
import { isTerminal } from "./lifecycle.ts";

export const STUCK_CLASSES = ["never_claimed", "admission_refused", "in_progress", "build_in_progress"] as const;
export type StuckClass = (typeof STUCK_CLASSES)[number];

export const NEVER_CLAIMED_AFTER_MS = 2 * 60_000;
export const NO_PROGRESS_AFTER_MS = 2 * 60_000;

export interface StuckInput {
  status: string;
  dependsOn?: string | null;
  admissionCheckReason?: string | null;
  lastAdmissionCheckAt?: Date | null;
  createdAt: Date;
  claimedAt?: Date | null;
  progressAt?: Date | null;
}

/**
 * `dependencyStatus`: the status of `dependsOn` (null when there is none or it is gone);
 * `claimerLastSeen`: the last heartbeat of the host that claimed it (null when unknown).
 */
export function stuckClass(action: StuckInput, dependencyStatus: string | null, now: Date, claimerLastSeen: Date | null = null): StuckClass | null {
  if (action.status === "queued") {
    if (action.dependsOn && dependencyStatus && !isTerminal(dependencyStatus)) return "build_in_progress";
    if (action.admissionCheckReason) return "admission_refused";
    if (!action.lastAdmissionCheckAt && now.getTime() - action.createdAt.getTime() > NEVER_CLAIMED_AFTER_MS) return "never_claimed";
    return null;
  }
  if (action.status === "in_progress") {
    const last = action.progressAt ?? action.claimedAt ?? action.createdAt;
    const silentFor = now.getTime() - last.getTime();
    if (silentFor > NO_PROGRESS_AFTER_MS) return "in_progress";
    const hostSilent = !!claimerLastSeen && !isLive(claimerLastSeen, now);
    return hostSilent && silentFor > LIVE_WINDOW_MS ? "in_progress" : null;
  }
  return null;
}
