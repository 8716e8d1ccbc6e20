/**
 * Reading and removing apps. Another group's app is "not found", exactly like an unknown one.
 */
import { LockMode } from "@mikro-orm/core";
import { appNameKey } from "@platform/bus";
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { canSeeGroup, spansEveryGroup, type Caller } from "@platform/caller";
import { App, Build } from "../entities/index.ts";
import { announceBuildsDeleted } from "./purge.ts";

export function appNotFound(appName: string, branch?: string): PlatformError {
  return PlatformError.notFound(branch ? `App '${appName}' has no branch '${branch}'` : `App '${appName}' not found`);
}

/**
 * Held, until the transaction ends, by every write that decides which branch of an app is
 * production: set-production, deleting a branch, registering another branch. Without it, a branch
 * promoted (or registered) while another is deleted could leave the app without a production branch.
 */
export async function holdProductionLock(em: EntityManager, appName: string): Promise<void> {
  await em.getConnection().execute("select pg_advisory_xact_lock(hashtext(?))", [`apps.production.${appNameKey(appName)}`], "all", em.getTransactionContext());
}

/**
 * Every branch row of an app the caller may see, production first: in the selected group, or for
 * a platform operator who named no group, in any.
 */
export async function appBranches(em: EntityManager, caller: Caller, appName: string): Promise<App[]> {
  const rows = await em.find(App, { appName: appNameKey(appName) }, { orderBy: { isProduction: "desc", createdAt: "asc" } });
  const anyGroup = !caller.selectedGroup || spansEveryGroup(caller);
  const visible = rows.filter((a) => canSeeGroup(caller, a.groupSlug) && (anyGroup || a.groupSlug === caller.selectedGroup));
  if (visible.length === 0) throw appNotFound(appName);
  return visible;
}

/** One branch of an app; without a branch, the production branch. */
export async function findApp(em: EntityManager, caller: Caller, appName: string, branch?: string): Promise<App> {
  const rows = await appBranches(em, caller, appName);
  if (!branch) return rows[0]!;
  const row = rows.find((a) => a.branch === branch);
  if (!row) throw appNotFound(appName, branch);
  return row;
}

export async function listApps(em: EntityManager, caller: Caller): Promise<App[]> {
  const where = spansEveryGroup(caller) ? {} : { groupSlug: caller.selectedGroup };
  if (!caller.platformOperator && !canSeeGroup(caller, caller.selectedGroup)) return [];
  return em.find(App, where, { orderBy: { appName: "asc", isProduction: "desc", branch: "asc" } });
}

/**
 * Deletes one branch's registration. The production branch of an app that has other branches
 * must hand production over first, so the app is never left without one.
 */
export async function deleteApp(em: EntityManager, caller: Caller, appName: string, branch?: string): Promise<void> {
  await holdProductionLock(em, appName);
  const rows = await appBranches(em, caller, appName);
  const found = branch ? rows.find((a) => a.branch === branch) : rows.length === 1 ? rows[0] : undefined;
  // Held to the commit, and everything below read after it: a build accepted meanwhile holds the
  // row in share mode (buildWriter) and is either seen here as in flight or waits, then finds
  // the branch gone; an agent resolving a deploy's release waits too (resolveRelease).
  const target = found && (await em.findOne(App, { id: found.id }, { lockMode: LockMode.PESSIMISTIC_WRITE, refresh: true }));
  if (found && !target) throw appNotFound(appName, found.branch);
  if (!target) {
    if (branch) throw appNotFound(appName, branch);
    throw PlatformError.conflict({
      code: "branch_required",
      message: `App '${appName}' has ${rows.length} branches; name the one to delete with ?branch=.`,
      branches: rows.map((a) => a.branch),
    });
  }
  // Anything that may still serve or be in flight keeps the registration: deleted, it would leave
  // a route and replicas that no route of the API could reach any more.
  if (target.runningVersion || !["undeployed", "failed"].includes(target.deployStatus)) {
    throw PlatformError.conflict({
      code: "app_running",
      message: `Branch '${target.branch}' of '${appName}' is ${target.deployStatus}${target.runningVersion ? ` and ${target.runningVersion} still serves` : ""}; undeploy it before deleting it.`,
      deploy_status: target.deployStatus,
    });
  }
  // A build not yet ended would publish an image, and its deploy fail, for a branch gone.
  const building = await em.findOne(Build, { appId: target.id, status: "queued" }, { fields: ["id"], orderBy: { createdAt: "asc" } });
  if (building) {
    throw PlatformError.conflict({
      code: "build_in_flight",
      message: `Build ${building.id} of branch '${target.branch}' of '${appName}' has not ended; cancel it (POST /api/deployments/${building.id}/cancel) or wait for it, then delete the branch.`,
      build_id: building.id,
    });
  }
  if (target.isProduction && rows.length > 1) {
    throw PlatformError.conflict({
      code: "production_branch",
      message: `Branch '${target.branch}' is production for '${appName}'; promote another branch with set-production first.`,
    });
  }
  await announceBuildsDeleted(em, target, true);
  em.remove(target);
}
