/**
 * The point of no return (spec doc 1 section 3.2): a DEPLOY past its blue/green swap commit (the
 * router flip, ARCHITECTURE section 5) can no longer be cancelled; it rolls forward to completed
 * and a cancel answers `refused_past_point_of_no_return`. So does one of a single-step action in
 * flight (see PHASED_TYPES), and a BUILD packaging its image (BUILD_PACKAGE_PHASE).
 *
 * The agent marks the moment by reporting the phase SWAP_COMMIT_PHASE through ReportProgress;
 * the queue stores it as `swap_committed_at`, and `isPastPointOfNoReturn` is what cancel asks.
 */

/** The phase an agent reports right after the route flip of a blue/green deploy. */
export const SWAP_COMMIT_PHASE = "swap_committed";

/** Action types with a swap commit. */
const SWAPPING_TYPES = new Set(["DEPLOY", "RETRY"]);

/**
 * Action types the agent runs in phases and stops between them when a cancel is flagged. Any other
 * action in flight (UNDEPLOY, SERVICE_ACTION, RECONCILE_ROUTING) is one step whose first change
 * (a route taken away, a replica stopped) is made as soon as it is claimed: it is past its point
 * of no return from the claim on, and a cancel would promise what never happens.
 */
const PHASED_TYPES = new Set(["BUILD", ...SWAPPING_TYPES]);

export function marksSwapCommit(phase: string): boolean {
  return phase === SWAP_COMMIT_PHASE;
}

/**
 * The last phase of a BUILD: its commands have run, and it stores and publishes the image. A
 * cancel asked from then on would be heard only once the build had completed (and its deploy
 * been cancelled for a build that did not stop), so it is refused and the build completes.
 */
export const BUILD_PACKAGE_PHASE = "package";

export function isPastPointOfNoReturn(action: { actionType: string; status: string; swapCommittedAt?: Date | null; phase?: string | null }): boolean {
  if (action.status !== "in_progress") return false;
  if (!PHASED_TYPES.has(action.actionType)) return true;
  if (action.actionType === "BUILD") return action.phase === BUILD_PACKAGE_PHASE;
  return !!action.swapCommittedAt;
}
