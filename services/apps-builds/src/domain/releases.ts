/**
 * A release is what a deploy runs (spec doc 1 section 4.5): the image of a build tag, the
 * effective config (the repository config of that commit with the dashboard overlay), the app's
 * variables at that moment and the front doors.
 *
 * deploy-queue resolves one with the tenant's caller when a deployment is queued (tenancy, the
 * preflight quarantine, "no successful build for the tag"); the agent resolves one without a
 * caller when it runs the claimed action, so the variables are those of the deploy's start.
 */
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import type { Caller } from "@platform/caller";
import { App, Build } from "../entities/index.ts";
import { Variable } from "../entities/variables.ts";
import { appBranches, appNotFound } from "./apps.ts";
import { publicHosts, type RouterSettings } from "./front-door.ts";
import { effectiveConfig, type BaseConfig, type Overlay } from "./overlay.ts";
import { requirePreflightPassed } from "./preflight.ts";

export interface ReleaseQuery {
  appName: string;
  branch: string;
  imageTag: string;
  groupSlug: string;
  skipPreflight: boolean;
  allowPendingBuild: boolean;
}

export interface Release {
  app: App;
  imageTag: string;
  buildId: string | null;
  config: Record<string, unknown>;
  env: Record<string, string>;
  hosts: string[];
}

async function appForCaller(em: EntityManager, caller: Caller, q: ReleaseQuery): Promise<App> {
  const rows = await appBranches(em, caller, q.appName);
  if (!q.branch) return rows.find((a) => a.isProduction) ?? rows[0]!;
  const matching = rows.filter((a) => a.branch === q.branch);
  if (matching.length === 0) throw appNotFound(q.appName, q.branch);
  if (matching.length > 1) {
    throw PlatformError.conflict({
      code: "ambiguous_group",
      message: `App '${q.appName}' branch '${q.branch}' exists in several groups (${matching.map((a) => a.groupSlug).join(", ")}); retry with ?group=<slug>.`,
      groups: matching.map((a) => a.groupSlug),
    });
  }
  return matching[0]!;
}

/** The tagged build exists but its row does not say it finished (yet). */
class BuildNotFinished extends PlatformError {}

async function buildOf(em: EntityManager, app: App, q: ReleaseQuery): Promise<Build | null> {
  if (q.imageTag) {
    const build = await em.findOne(Build, { appId: app.id, tag: q.imageTag });
    const finished = build?.status === "completed" || build?.status === "failed" || build?.status === "cancelled";
    if (build?.status === "completed" || (q.allowPendingBuild && build && !finished)) return build;
    const refusal = `App '${app.appName}' (branch ${app.branch}) has no successful build tagged '${q.imageTag}'.`;
    throw build && !finished ? new BuildNotFinished(400, refusal) : PlatformError.badRequest(refusal);
  }
  const latest = await em.findOne(Build, { appId: app.id, status: "completed" }, { orderBy: { completedAt: "desc" } });
  if (!latest) throw PlatformError.badRequest(`App '${app.appName}' (branch ${app.branch}) has no successful build to deploy; trigger one with POST /api/builds.`);
  return latest;
}

export async function resolveRelease(em: EntityManager, caller: Caller | null, q: ReleaseQuery, router: RouterSettings): Promise<Release> {
  let app: App | null;
  if (caller) {
    app = await appForCaller(em, caller, q);
    if (!q.skipPreflight) requirePreflightPassed(app);
  } else {
    app = await em.findOne(App, { groupSlug: q.groupSlug, appName: q.appName, branch: q.branch });
    // An agent about to deploy: a deletion of the branch under way (deleteApp holds the row) is
    // waited for, so a deploy never starts what a deleted branch left no route of the API to stop.
    const held = app && (await em.getConnection().execute<unknown[]>("select 1 from apps where id = ? for share", [app.id], "all", em.getTransactionContext()));
    if (!app || held?.length === 0) throw appNotFound(q.appName, q.branch);
  }
  const build = await buildOf(em, app, q);
  const variables = await em.find(Variable, { appId: app.id }, { orderBy: { key: "asc" } });
  return {
    app,
    imageTag: build?.tag ?? q.imageTag,
    buildId: build?.id ?? null,
    config: effectiveConfig((build?.config ?? app.baseConfig) as BaseConfig, (app.overlay ?? {}) as Overlay),
    env: Object.fromEntries(variables.map((v) => [v.key, v.value])),
    hosts: publicHosts(app, router),
  };
}

/** How long the agent's release waits for its build's completion to reach the builds row (within the agent's RPC deadline). */
export const BUILD_RECORD_WAIT_MS = 4_000;
/** Another replica's tracker may be the one that writes the row: it is looked at again this often. */
const BUILD_RECORD_POLL_MS = 20;

/**
 * Said by this process's build tracker each time it has committed updates of builds rows, so a
 * release waiting for its build's completion looks again at once rather than at its next poll.
 */
export class BuildRowsWritten {
  #waiters = new Set<() => void>();

  notify(): void {
    const waiters = [...this.#waiters];
    this.#waiters.clear();
    for (const wake of waiters) wake();
  }

  /** Resolves at the next notify, or after `maxMs`. */
  next(maxMs: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#waiters.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, maxMs);
      timer.unref();
      this.#waiters.add(wake);
    });
  }
}

export const buildRowsWritten = new BuildRowsWritten();

/**
 * The release of a deploy the agent has claimed (no caller). The queue lets a deploy be claimed
 * only once its build completed there, and the builds row hears of that completion from the
 * queue's event a moment later: a build the row still shows running is waited for, a bounded
 * while, rather than refused.
 */
export async function resolveClaimedRelease(
  read: <T>(fn: (em: EntityManager) => Promise<T>) => Promise<T>,
  q: Omit<ReleaseQuery, "allowPendingBuild">,
  router: RouterSettings,
  waitMs = BUILD_RECORD_WAIT_MS,
  pollMs = BUILD_RECORD_POLL_MS,
): Promise<Release> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    // Listening before the read: a completion written while it runs still wakes this wait.
    const written = buildRowsWritten.next(pollMs);
    try {
      return await read((em) => resolveRelease(em, null, { ...q, allowPendingBuild: false }, router));
    } catch (err) {
      if (!(err instanceof BuildNotFinished) || Date.now() >= deadline) throw err;
      await written;
    }
  }
}
