/**
 * The point of no return (spec doc 1 section 3.2): a DEPLOY past its blue/green swap commit (the
 * router flip, ARCHITECTURE section 5) can no longer be cancelled; it rolls forward to completed
 * and a cancel answers `refused_past_point_of_no_return`.
 *
 * The agent marks the moment by reporting the phase SWAP_COMMIT_PHASE through ReportProgress;
 * the queue stores it as `swap_committed_at`, and `isPastPointOfNoReturn` is what cancel asks.
 */

/** The phase an agent reports right after the route flip of a blue/green deploy. */
export const SWAP_COMMIT_PHASE = "swap_committed";

/** Action types with a swap commit. */
const SWAPPING_TYPES = new Set(["DEPLOY", "RETRY"]);

export function marksSwapCommit(phase: string): boolean {
  return phase === SWAP_COMMIT_PHASE;
}

export function isPastPointOfNoReturn(action: { actionType: string; status: string; swapCommittedAt?: Date | null }): boolean {
  return SWAPPING_TYPES.has(action.actionType) && action.status === "in_progress" && !!action.swapCommittedAt;
}
