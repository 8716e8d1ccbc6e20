/**
 * Deleting a branch (DELETE /api/apps/{app}) while an action of it is queued or running: a deploy
 * accepted but not yet claimed would start replicas and a route for a branch no route of the API
 * could reach any more (audit P). apps-builds refuses what it knows of (a running release, a
 * build in flight: `build_in_flight`, with the build's id); the queue's other live actions are
 * deploy-queue's, asked first. A preflight does not hold a deletion: it only reads the repository.
 */
import type { Action } from "@platform/proto";
import { PlatformError } from "@platform/errors";

/** Left out of the queue's answer: a preflight holds nothing; a build is apps-builds' to refuse (build_in_flight). */
export const NOT_HOLDING_DELETION = ["GIT_PREFLIGHT", "BUILD"];

/** `live`: the app's queued and running actions, NOT_HOLDING_DELETION left out. */
export function refuseDeletionDuringAction(live: readonly Pick<Action, "actionId" | "actionType" | "branch" | "status">[], branch: string | undefined): void {
  const blocking = live.find((a) => !branch || a.branch === branch);
  if (!blocking) return;
  throw PlatformError.conflict({
    code: "action_in_flight",
    message:
      `${blocking.actionType} ${blocking.actionId.slice(0, 8)} of branch '${blocking.branch}' is ${blocking.status === "queued" ? "queued" : "running"}; ` +
      `cancel it (POST /api/deployments/${blocking.actionId}/cancel) or wait for it to end, then delete the branch.`,
    action_id: blocking.actionId,
    action_type: blocking.actionType,
  });
}
