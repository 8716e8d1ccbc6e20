/**
 * An app's deploy state (spec doc 1 sections 2.1 and 3.4), kept in step with the queue's DEPLOY,
 * RETRY and UNDEPLOY actions through `action_updated` events:
 *
 * - claimed: `deploying` (`undeploying` for an UNDEPLOY);
 * - swap committed (still in progress, the old colour draining): running_version, running_since
 *   and running_build_id name the new release, which serves from then on;
 * - completed: `running` with running_version, running_since (its swap commit, else its
 *   completion) and running_build_id of the release (rule 3: a successful retry reports the
 *   retried tag; rule 5: a retry has no build id);
 *   an UNDEPLOY completed clears them (`undeployed`, rule 4);
 * - failed: `failed` (`undeploy_failed`), the running_* fields still naming what serves (rule 4),
 *   and `deploy_warning` when an older version still serves. A deploy that failed before any
 *   agent claimed it (its build failed, say) changed nothing that runs: only last_deploy_* say so;
 * - cancelled: back to what it was (`running` when something serves, else `undeployed`); one
 *   cancelled before any agent claimed it leaves the deploy status as it was.
 *
 * last_deploy_status and last_deploy_error describe the latest such action; last_crash_output
 * only a failed deploy whose health-check phase captured output. An UNDEPLOY with `purge` also
 * deletes the branch's builds (the agent deleted their images).
 */
import type { EntityManager } from "@platform/db";
import { deriveFeatureFlags, type AppConfig } from "@platform/app-config";
import { App, Build } from "../entities/index.ts";
import { announceBuildsDeleted } from "./purge.ts";

export const DEPLOY_ACTION_TYPES = new Set(["DEPLOY", "RETRY", "UNDEPLOY"]);

/** The tag serving on an app's branch: null whenever it is undeployed (rule 4). */
export function servingVersion(app: Pick<App, "deployStatus" | "runningVersion">): string | null {
  return app.deployStatus === "undeployed" ? null : (app.runningVersion ?? null);
}

export interface DeployActionUpdate {
  action_id: string;
  action_type: string;
  status: string;
  app_name: string;
  branch: string;
  group_slug: string;
  image_tag?: string | null;
  build_id?: string | null;
  error_message?: string | null;
  /** When the action was queued; absent from updates written before it was announced. */
  created_at?: string | null;
  /** Null while no agent has claimed the action: one that ends unclaimed never ran. */
  claimed_at?: string | null;
  completed_at?: string | null;
  /** When the route moved to the release: it serves from then on, while the old one drains. */
  swap_committed_at?: string | null;
  /** When deploy-queue wrote this update: updates apply in this order, whatever order they arrive in. */
  updated_at?: string | null;
  result?: { crash_output?: Record<string, string[]>; purge?: boolean; mounts?: Record<string, string | null> } | null;
}

/** The live routing shape a completed deploy reported; null when it reported none (an older agent). */
function mountsOf(result: DeployActionUpdate["result"]): Record<string, string | null> | null {
  const mounts = result?.mounts;
  if (!mounts || typeof mounts !== "object" || Array.isArray(mounts)) return null;
  const clean: Record<string, string | null> = {};
  for (const [service, mount] of Object.entries(mounts)) {
    if (mount === null || typeof mount === "string") clean[service] = mount;
  }
  return clean;
}

function crashOutput(result: DeployActionUpdate["result"]): Record<string, string[]> | null {
  const out = result?.crash_output;
  if (!out || typeof out !== "object") return null;
  const clean: Record<string, string[]> = {};
  for (const [service, lines] of Object.entries(out)) {
    if (Array.isArray(lines)) clean[service] = lines.filter((l): l is string => typeof l === "string").slice(-30);
  }
  return Object.keys(clean).length > 0 ? clean : null;
}

/** The release of `u` serving since `since`: rules 3 and 5 (a retry reports the retried tag and no build id). */
function serving(app: App, u: DeployActionUpdate, since: Date): void {
  app.runningVersion = u.image_tag ?? app.runningVersion ?? null;
  app.runningSince = since;
  app.runningBuildId = u.action_type === "DEPLOY" && u.build_id ? u.build_id : null;
}

export async function applyDeployUpdate(em: EntityManager, u: DeployActionUpdate): Promise<App | null> {
  const app = await em.findOne(App, { groupSlug: u.group_slug, appName: u.app_name, branch: u.branch });
  if (!app) return null;
  // An action queued before this registration of the branch was an earlier one's, deleted since
  // (one that slipped in as it was deleted ends failed, its branch gone): it is not this one's state.
  const created = u.created_at ? new Date(u.created_at) : null;
  if (created && created < app.createdAt) return app;
  // Updates can arrive out of order (relay replicas, a redelivered batch): one older than what
  // the app shows would put back a state that has passed, e.g. deploying after running.
  const at = u.updated_at ? new Date(u.updated_at) : null;
  if (at && !Number.isNaN(at.getTime())) {
    if (app.lastDeployUpdateAt && at < app.lastDeployUpdateAt) return app;
    app.lastDeployUpdateAt = at;
  }
  const undeploy = u.action_type === "UNDEPLOY";
  app.lastDeployActionId = u.action_id;
  app.lastDeployStatus = u.status;
  // Crash output describes only a failed latest deploy.
  if (u.status !== "failed" || undeploy) app.lastCrashOutput = null;
  switch (u.status) {
    case "queued":
      // The latest deploy action has no error yet; the previous one's is history.
      app.lastDeployError = null;
      return app;
    case "in_progress":
      app.deployStatus = undeploy ? "undeploying" : "deploying";
      app.lastDeployError = null;
      // Past the swap commit the release serves (rule: the tag serving now), though the deploy
      // goes on while the old colour drains; it can only roll forward from there.
      if (!undeploy && u.swap_committed_at) serving(app, u, new Date(u.swap_committed_at));
      return app;
    case "completed":
      app.lastDeployError = null;
      app.lastCrashOutput = null;
      app.deployWarning = null;
      if (undeploy) {
        app.deployStatus = "undeployed";
        app.runningVersion = null;
        app.runningSince = null;
        app.runningBuildId = null;
        app.runningMounts = null;
        if (u.result?.purge === true) {
          // purge: the images went with the undeploy; the builds that made them go too.
          await announceBuildsDeleted(em, app, false);
          app.buildCount += await em.nativeDelete(Build, { appId: app.id });
          app.latestBuild = null;
        }
      } else {
        app.deployStatus = "running";
        // Spec 2.1: database, cache and email follow the repository's config at every deploy:
        // the config of the build deployed (a rollback ships an older one), else the latest.
        const deployed = u.image_tag ? await em.findOne(Build, { appId: app.id, tag: u.image_tag }, { fields: ["config"] }) : null;
        const repoConfig = deployed?.config ?? app.baseConfig;
        if (repoConfig) {
          const flags = deriveFeatureFlags(repoConfig as AppConfig);
          app.databaseEnabled = flags.database_enabled;
          app.cacheEnabled = flags.cache_enabled;
          app.emailEnabled = flags.email_enabled;
        }
        serving(app, u, new Date(u.swap_committed_at ?? u.completed_at ?? Date.now()));
        app.firstDeployedAt ??= app.runningSince;
        app.runningMounts = mountsOf(u.result);
      }
      return app;
    case "failed": {
      const error = u.error_message || (undeploy ? "The undeploy failed." : "The deploy failed.");
      app.lastDeployError = error;
      if (undeploy) {
        if (u.claimed_at) app.deployStatus = "undeploy_failed";
        return app;
      }
      // A redeploy of the running tag (a scale, say) that fails leaves the running release serving too.
      const warning = !app.runningVersion || app.deployStatus === "undeployed"
        ? null
        : app.runningVersion !== u.image_tag
          ? `The deploy of ${u.image_tag ?? "a new version"} failed (${error}); ${app.runningVersion} still serves.`
          : `A new deploy of ${u.image_tag} failed (${error}); the release that was already running still serves.`;
      // Nothing ran (its build failed, say): the deploy status still describes what serves; only
      // the warning tells of the newer deploy that failed.
      if (!u.claimed_at) {
        if (warning) app.deployWarning = warning;
        return app;
      }
      app.deployStatus = "failed";
      app.lastCrashOutput = crashOutput(u.result);
      app.deployWarning = warning;
      return app;
    }
    case "cancelled":
      app.lastDeployError = u.error_message ?? null;
      // Cancelled before any agent claimed it, it changed nothing that runs.
      if (u.claimed_at) app.deployStatus = app.runningVersion ? "running" : "undeployed";
      return app;
    default:
      return app;
  }
}
