/**
 * The queue's states (spec doc 1 sections 2.5, 3.1, 3.2): an action is queued, in_progress, then
 * completed, failed or cancelled. BUILD actions also report the live lifecycle names that
 * `queue_status` carries.
 */

export const ACTION_STATUSES = ["queued", "in_progress", "completed", "failed", "cancelled"] as const;
export type ActionStatus = (typeof ACTION_STATUSES)[number];

export const TERMINAL_STATUSES: readonly ActionStatus[] = ["completed", "failed", "cancelled"];
export const LIVE_STATUSES: readonly ActionStatus[] = ["queued", "in_progress"];

/** What an agent may finish an action with. */
export const COMPLETION_STATUSES = ["completed", "failed", "cancelled"] as const;
export type CompletionStatus = (typeof COMPLETION_STATUSES)[number];

/**
 * A cancelled action's error_message: what ended it, with the reason the canceller gave (spec
 * 4.5, "optional body with a reason"), so the deployment and the app's last_deploy_error say why.
 */
export function cancelledErrorMessage(said: string | null, reason: string | null | undefined): string | null {
  if (!reason) return said;
  return said ? `${said} Reason: ${reason}` : `Cancelled: ${reason}`;
}

export function isTerminal(status: string): boolean {
  return (TERMINAL_STATUSES as readonly string[]).includes(status);
}

export function isCompletionStatus(status: string): status is CompletionStatus {
  return (COMPLETION_STATUSES as readonly string[]).includes(status);
}

/** Action types named by the interface (doc 1 section 2.5). */
export const ACTION_TYPES = [
  "BUILD",
  "DEPLOY",
  "RETRY",
  "EXEC",
  "INSPECT",
  "BACKUP_QUERY",
  "DRIVE_QUERY",
  "GIT_PREFLIGHT",
  "NS_ZONE_SETUP",
  "RECONCILE_ROUTING",
  "SERVICE_ACTION",
  "PURGE_APP",
  "UNDEPLOY",
  "RESTORE",
  "DRIVE_APPLY",
] as const;

/** Fast request-response RPCs: never in the deploy lane (ARCHITECTURE section 4). */
export const FAST_RPC_TYPES = new Set(["EXEC", "INSPECT", "BACKUP_QUERY", "DRIVE_QUERY", "GIT_PREFLIGHT", "NS_ZONE_SETUP"]);

const BUILD_QUEUE_STATUS: Record<ActionStatus, string> = {
  queued: "queued",
  in_progress: "build_in_progress",
  completed: "build_completed",
  failed: "build_failed",
  cancelled: "build_cancelled",
};

/**
 * The live lifecycle name: for BUILD actions queued, build_in_progress, build_completed,
 * build_failed, build_cancelled (doc 1 section 3.1); other actions report their status.
 */
export function queueStatus(action: { actionType: string; status: string }): string {
  if (action.actionType === "BUILD") return BUILD_QUEUE_STATUS[action.status as ActionStatus] ?? action.status;
  return action.status;
}
