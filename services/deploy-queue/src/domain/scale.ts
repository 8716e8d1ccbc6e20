/**
 * Scale (spec doc 1 section 4.4), the deploy-queue half: refused while a container-class action
 * is in flight on the branch (`scale_in_flight`), and after apps-builds saved the count, the
 * running image is deployed again with it. When that deploy cannot be queued the count stays
 * saved and the answer says so (`scale_saved_not_deployed`).
 */
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { Action, Agent } from "../entities/index.ts";
import { advisoryLocks } from "./advisory-locks.ts";
import { CONTAINER_ACTION_TYPES } from "./app-actions.ts";
import { isLive } from "./agents.ts";
import { reportsService, type InventoryEntry } from "./services-status.ts";

/**
 * Makes scales of one branch mutually exclusive, from the in-flight check through the queued
 * DEPLOY. Without it two concurrent scales (READ COMMITTED) both saw nothing in flight and both
 * saved and queued a DEPLOY. The caller holds the transaction open across apps-builds' save and
 * resolveRelease (two short calls; scale is rare), so a second scale waits here and then finds
 * the first one's DEPLOY in flight before anything of it is saved.
 */
export async function lockScaleTarget(em: EntityManager, target: { groupSlug: string; appName: string; branch: string }): Promise<void> {
  await advisoryLocks(em, [`deploy_queue.scale.${target.groupSlug}/${target.appName}/${target.branch}`]);
}

export async function refuseScaleInFlight(em: EntityManager, target: { groupSlug: string; appName: string; branch: string }): Promise<void> {
  const busy = await em.findOne(
    Action,
    { ...target, actionType: { $in: [...CONTAINER_ACTION_TYPES] }, status: { $in: ["queued", "in_progress"] } },
    { orderBy: { createdAt: "asc" } },
  );
  if (!busy) return;
  throw PlatformError.conflict({
    code: "scale_in_flight",
    message: `A ${busy.actionType} of '${target.appName}' (branch ${target.branch}) is ${busy.status}; scale once it has finished.`,
    action_id: busy.id,
    action_type: busy.actionType,
    status: busy.status,
  });
}

/** Replicas of the service running now on live hosts, from their inventories; null when no live host reports. */
export async function deployedReplicas(em: EntityManager, target: { groupSlug: string; appName: string; branch: string }, service: string, now: Date): Promise<number | null> {
  const agents = (await em.find(Agent, {})).filter((a) => isLive(a.lastSeen, now));
  const reports = agents.map((a) => a.facts?.inventory).filter((inv): inv is InventoryEntry[] => Array.isArray(inv));
  if (reports.length === 0) return null;
  return reports
    .flat()
    .filter((e) => reportsService(e, target, service))
    .reduce((n, e) => n + (Number(e.replicas_running) || 0), 0);
}

export function scaleSavedNotDeployed(err: unknown, saved: { requested: number; previous: number; deployed: number | null }): PlatformError {
  const status = err instanceof PlatformError ? err.status : 500;
  const reason = err instanceof Error ? err.message : String(err);
  return new PlatformError(status >= 400 ? status : 500, {
    code: "scale_saved_not_deployed",
    message: `The replica count was saved, but the redeploy could not be queued: ${reason}`,
    saved: true,
    requested: saved.requested,
    previous: saved.previous,
    deployed: saved.deployed,
    reason,
  });
}
