/**
 * Deployments (spec doc 1 sections 2.4, 3.2, 4.5): DEPLOY, RETRY and UNDEPLOY actions seen as
 * deployments. A deployment's id is its action's id.
 *
 * Status (3.2) follows the action and the phase the agent reports:
 * queued → setup_in_progress (fetch, start, health checks) → ready_to_deploy (checks passed) →
 * in_progress (the swap committed, the route moving) → running (the new release serves, the old
 * colour drains) → completed | failed | cancelled; an UNDEPLOY queued or in flight is `undeploying`.
 */
import { randomUUID } from "node:crypto";
import type { EntityManager } from "@platform/db";
import { appNameKey } from "@platform/bus";
import { PlatformError } from "@platform/errors";
import { actorOf, canSeeGroup, spansEveryGroup, type Caller } from "@platform/caller";
import { Action, Agent, HistoryRecord } from "../entities/index.ts";
import { APP_LANE_TYPES } from "./admission.ts";
import { advisoryLocks } from "./advisory-locks.ts";
import { announce } from "./events.ts";
import { DEPLOYMENT_TYPES, isDeploymentType } from "./history.ts";
import { canAct, canRead, checkActionIdPrefix, findActionByPrefix } from "./lookup.ts";
import { dispatch, type Dispatched, type PlacementPlan } from "./placement.ts";
import { SWAP_COMMIT_PHASE } from "./point-of-no-return.ts";

/** Phases the agent reports on a DEPLOY (agent/src/deployer.ts), in order. */
export const DEPLOY_PHASES = ["setup", "start", "health_check", "ready", SWAP_COMMIT_PHASE, "drain"] as const;

export const DEPLOYMENTS_LIMIT = { min: 1, max: 200, default: 50 } as const;

export function deploymentStatus(a: Pick<Action, "actionType" | "status" | "phase">): string {
  // Spec 3.2: an accepted undeploy is undeploying from the moment its action is queued.
  if (a.actionType === "UNDEPLOY" && (a.status === "queued" || a.status === "in_progress")) return "undeploying";
  if (a.status !== "in_progress") return a.status;
  if (a.phase === "ready") return "ready_to_deploy";
  if (a.phase === SWAP_COMMIT_PHASE) return "in_progress";
  if (a.phase === "drain") return "running";
  return "setup_in_progress";
}

export function resolvePage(limit: number | undefined, offset: number | undefined): { limit: number; offset: number } {
  const l = limit === undefined || limit === 0 ? DEPLOYMENTS_LIMIT.default : limit;
  if (!Number.isInteger(l) || l < DEPLOYMENTS_LIMIT.min || l > DEPLOYMENTS_LIMIT.max) {
    throw PlatformError.invalid(`limit must be an integer from ${DEPLOYMENTS_LIMIT.min} to ${DEPLOYMENTS_LIMIT.max}.`);
  }
  const o = offset ?? 0;
  if (!Number.isInteger(o) || o < 0) throw PlatformError.invalid("offset must be a non-negative integer.");
  return { limit: l, offset: o };
}

/** What deploy-queue needs of a resolved release (apps-builds ResolveRelease). */
export interface ReleaseRef {
  appName: string;
  branch: string;
  groupSlug: string;
  imageTag: string;
  buildId: string;
  configPath: string;
  runningVersion?: string;
}

/**
 * The static-site settings of POST /api/deployments (`aliases`, `record_fqdn`, `spa_fallback`, ...)
 * belong to `type: static` apps (spec doc 1 section 4.5). Sent for any other app they would do
 * nothing, so they are refused rather than dropped without a word.
 */
export function checkStaticSiteFields(fields: readonly string[], configJson: string, appName: string): void {
  if (fields.length === 0) return;
  let type: unknown = "container";
  try {
    type = (JSON.parse(configJson || "{}") as { type?: unknown }).type ?? "container";
  } catch {
    // A config that does not parse is no static app.
  }
  if (type === "static") return;
  const named = fields.map((f) => `'${f}'`).join(", ");
  throw PlatformError.badRequest({
    code: "static_site_fields",
    message: `${named} ${fields.length === 1 ? "applies" : "apply"} to type: static apps only; '${appName}' is a ${String(type)} app.`,
    fields: [...fields],
  });
}

/**
 * The services a deployment names (POST /api/deployments `services`): names the release's config
 * declares, each once; null (every service) when none is named. A name it does not declare is the
 * spec's 400, said now rather than as a failed deploy on the app's record.
 */
export function requestedServices(services: unknown, configJson: string): string[] | null {
  if (services === null || services === undefined) return null;
  if (!Array.isArray(services) || services.some((s) => typeof s !== "string" || !s.trim())) {
    throw PlatformError.badRequest("services must be a list of service names.");
  }
  if (services.length === 0) return null;
  let declared: string[] = [];
  try {
    declared = Object.keys((JSON.parse(configJson || "{}") as { services?: Record<string, unknown> }).services ?? {});
  } catch {
    // A config that does not parse declares nothing: every name is refused below.
  }
  const names = [...new Set((services as string[]).map((s) => s.trim()))];
  const unknown = names.filter((n) => !declared.includes(n));
  if (unknown.length > 0) {
    throw PlatformError.badRequest({
      code: "service_not_declared",
      message: `The release's config declares no service ${unknown.map((n) => `'${n}'`).join(", ")}; it declares ${declared.length > 0 ? declared.map((n) => `'${n}'`).join(", ") : "none"}.`,
      services: unknown,
    });
  }
  return names;
}

export interface DeploymentInput {
  services: string[] | null;
  /** Checked with checkPlacementPlan. */
  placementPlan: PlacementPlan | null;
  reason: string;
}

/** Queues a DEPLOY of a resolved release; the caller's tenancy was checked by the resolution. */
export async function queueDeployment(
  em: EntityManager,
  caller: Caller,
  release: ReleaseRef,
  input: DeploymentInput,
  now: Date,
  dispatched?: Dispatched[],
): Promise<Action> {
  const plan = input.placementPlan;
  if (plan && !(await em.findOne(Agent, { hostId: plan.host }, { fields: ["hostId"] }))) {
    throw PlatformError.badRequest(`placement_plan.host '${plan.host}' is no agent host of this platform.`);
  }
  const id = randomUUID();
  const build = release.buildId ? await em.findOne(Action, { id: release.buildId }) : null;
  const action = em.create(Action, {
    id,
    actionType: "DEPLOY",
    status: "queued",
    groupSlug: release.groupSlug,
    appName: release.appName,
    branch: release.branch,
    imageTag: release.imageTag,
    commitMessage: build?.commitMessage ?? null,
    commitAuthor: build?.commitAuthor ?? null,
    deployWarnings: [],
    payload: {
      deployment_id: id,
      // A deploy of an image that exists is a no-build deploy: nothing attributes what it runs to a
      // build, so running_build_id goes null when it completes (spec 2.1 rule 5). The deploy of a
      // build is queued with it, at intake.
      build_id: null,
      app_name: release.appName,
      branch: release.branch,
      group_slug: release.groupSlug,
      image_tag: release.imageTag,
      config_path: release.configPath,
      previous_tag: release.runningVersion ?? null,
      services: input.services,
      placement_plan: plan,
      reason: input.reason,
    },
    createdBy: actorOf(caller),
    createdAt: now,
    updatedAt: now,
  });
  // The image is in the store of the host that built it; an operator's plan names another.
  const host = await dispatch(em, action, now, { preferHost: plan?.host ?? build?.claimedBy ?? null, dispatched });
  if (plan && host !== plan.host) {
    action.deployWarnings.push(`placement_plan named host ${plan.host}, which is not live and schedulable; the deploy was placed ${host ? `on ${host}` : "for the first agent to take it"}.`);
  }
  announce(em, action, now);
  return action;
}

function groupFilter(caller: Caller): { groupSlug?: string } | null {
  if (spansEveryGroup(caller)) return {};
  if (!caller.selectedGroup || !canSeeGroup(caller, caller.selectedGroup)) return null;
  return { groupSlug: caller.selectedGroup };
}

export interface Page<T> {
  items: T[];
  total: number;
}

/** A list's branch filter, as GET /api/builds has it: omitted (or empty), every branch. */
function branchFilter(branch: string | undefined): { branch?: string } {
  const b = branch?.trim();
  return b ? { branch: b } : {};
}

export async function listDeployments(
  em: EntityManager,
  caller: Caller,
  q: { appName: string; branch?: string; limit?: number; offset?: number },
): Promise<Page<Action>> {
  const { limit, offset } = resolvePage(q.limit, q.offset);
  const scope = groupFilter(caller);
  if (!scope) return { items: [], total: 0 };
  const where = { ...scope, actionType: { $in: [...DEPLOYMENT_TYPES] }, ...(q.appName ? { appName: appNameKey(q.appName) } : {}), ...branchFilter(q.branch) };
  const [items, total] = await em.findAndCount(Action, where, { orderBy: { createdAt: "desc", id: "desc" }, limit, offset });
  return { items, total };
}

export async function getDeployment(em: EntityManager, caller: Caller, id: string): Promise<Action> {
  const prefix = checkActionIdPrefix(id.trim());
  const action = await findActionByPrefix(em, prefix, (g) => canRead(caller, g));
  if (!action || !(DEPLOYMENT_TYPES as readonly string[]).includes(action.actionType)) {
    throw PlatformError.notFound(`Deployment '${id}' not found`);
  }
  return action;
}

export async function listHistory(
  em: EntityManager,
  caller: Caller,
  q: { appName: string; branch?: string; limit?: number; offset?: number },
): Promise<Page<HistoryRecord>> {
  if (!q.appName) throw PlatformError.invalid("app_name is required.");
  const { limit, offset } = resolvePage(q.limit, q.offset);
  const scope = groupFilter(caller);
  if (!scope) return { items: [], total: 0 };
  const where = { ...scope, appName: appNameKey(q.appName), ...branchFilter(q.branch) };
  const [items, total] = await em.findAndCount(HistoryRecord, where, { orderBy: { completedAt: "desc", id: "desc" }, limit, offset });
  return { items, total };
}

/** The per-phase output the agent reported, in phase order, plus the error. */
export function deploymentPhases(action: Action): Array<{ name: string; output: string }> {
  const phases = action.result?.phases;
  if (!phases || typeof phases !== "object") return [];
  const order = (name: string) => {
    const i = (DEPLOY_PHASES as readonly string[]).indexOf(name.split(":")[0]!);
    return i === -1 ? DEPLOY_PHASES.length : i;
  };
  return Object.entries(phases as Record<string, unknown>)
    .filter((e): e is [string, string] => typeof e[1] === "string")
    .sort((a, b) => order(a[0]) - order(b[0]))
    .map(([name, output]) => ({ name, output }));
}

// ---------------------------------------------------------------------------------------------
// App actions: undeploy, retry, reconcile, service actions

export interface AppActionInput {
  actionType: "UNDEPLOY" | "RETRY" | "RECONCILE_ROUTING" | "SERVICE_ACTION";
  groupSlug: string;
  appName: string;
  branch: string;
  imageTag?: string | null;
  /** The commit of the image it runs again (a RETRY), as the queue shows it. */
  commitMessage?: string | null;
  commitAuthor?: string | null;
  purge?: boolean;
  serviceName?: string | null;
  action?: "restart" | "stop" | "start" | null;
  payload?: Record<string, unknown>;
}

/** The tags of every build of a branch the queue knows: what an undeploy with purge deletes. */
export async function branchBuildTags(em: EntityManager, target: { groupSlug: string; appName: string; branch: string }): Promise<string[]> {
  const builds = await em.find(Action, { ...target, actionType: "BUILD", imageTag: { $ne: null } }, { fields: ["imageTag"] });
  return [...new Set(builds.map((b) => b.imageTag!))].sort();
}

/**
 * The failed DEPLOY (or RETRY) a retry re-runs: the latest deployment of the branch, which must
 * have failed. Only deployments since the branch was registered (`registeredAt`) count: those of
 * an earlier registration of the name, deleted since, are not this one's to retry.
 */
export async function retryTarget(em: EntityManager, groupSlug: string, appName: string, branch: string, registeredAt: Date | null = null): Promise<Action> {
  const latest = await em.findOne(
    Action,
    { groupSlug, appName, branch, actionType: { $in: ["DEPLOY", "RETRY", "UNDEPLOY"] }, ...(registeredAt ? { createdAt: { $gte: registeredAt } } : {}) },
    { orderBy: { createdAt: "desc", id: "desc" } },
  );
  // An undeploy since the failed deploy was the last word: a retry would bring the branch back.
  if (latest?.actionType === "UNDEPLOY") {
    throw PlatformError.conflict({
      code: "nothing_to_retry",
      message: `The latest action of '${appName}' (branch ${branch}) is an undeploy (${latest.status}), after its last deploy: there is nothing to retry; deploy it again instead.`,
    });
  }
  if (!latest || latest.status !== "failed") {
    throw PlatformError.conflict({
      code: "nothing_to_retry",
      message: latest
        ? `The latest deploy of '${appName}' (branch ${branch}) is ${latest.status}, not failed: there is nothing to retry.`
        : `App '${appName}' (branch ${branch}) has no deploy to retry.`,
    });
  }
  // A deploy that never ran because its build did not complete has no image to run again: the
  // build is what failed, and a retry of the deploy cannot mend it.
  const dependency = latest.dependsOn ? await em.findOne(Action, { id: latest.dependsOn }, { fields: ["id", "actionType", "status"] }) : null;
  if (dependency?.actionType === "BUILD" && dependency.status !== "completed") {
    throw PlatformError.conflict({
      code: "build_not_completed",
      message:
        `The latest deploy of '${appName}' (branch ${branch}) failed because its build ${dependency.id} ${dependency.status === "cancelled" ? "was cancelled" : "failed"}: ` +
        `there is no image to deploy again. Fix the build, then build again (POST /api/builds, or redeploy with rebuild).`,
      build_id: dependency.id,
    });
  }
  return latest;
}

/**
 * `retryTarget` in the transaction that queues the RETRY, under a lock held until it commits: of
 * concurrent retries of one failed deploy, one queues and the others find that RETRY latest (409).
 */
export async function lockedRetryTarget(em: EntityManager, groupSlug: string, appName: string, branch: string, registeredAt: Date | null = null): Promise<Action> {
  await advisoryLocks(em, [`deploy_queue.retry.${groupSlug}/${appName}/${branch}`]);
  return retryTarget(em, groupSlug, appName, branch, registeredAt);
}

/**
 * The undeploy a second undeploy of a branch is answered with: one still queued, with nothing of
 * the app lane asked for after it (a deploy queued since must be undeployed again), and asked
 * with the same purge (the answer says whether it purges). One in progress is not: the answer
 * says `queued` (spec 4.5), and what it took down may have been started again since it began.
 * Null when a new undeploy is needed. Taken under a lock held until the transaction commits, so
 * of two undeploys asked at once one is queued.
 */
export async function pendingUndeploy(em: EntityManager, caller: Caller, target: { groupSlug: string; appName: string; branch: string }, purge: boolean): Promise<Action | null> {
  if (!canAct(caller, target.groupSlug)) throw PlatformError.notFound(`App '${target.appName}' not found`);
  await advisoryLocks(em, [`deploy_queue.undeploy.${target.groupSlug}/${target.appName}/${target.branch}`]);
  const latest = await em.findOne(Action, { ...target, actionType: { $in: [...APP_LANE_TYPES] } }, { orderBy: { createdAt: "desc", id: "desc" } });
  if (latest?.actionType !== "UNDEPLOY" || latest.status !== "queued") return null;
  if ((latest.payload?.purge === true) !== purge) return null;
  return latest;
}

export async function queueAppAction(em: EntityManager, caller: Caller, input: AppActionInput, now: Date, dispatched?: Dispatched[]): Promise<Action> {
  if (!canAct(caller, input.groupSlug)) throw PlatformError.notFound(`App '${input.appName}' not found`);
  return createAppAction(em, input, actorOf(caller), now, dispatched);
}

/** Queues an app action on behalf of `createdBy` (a caller checked upstream, or the platform itself). */
export async function createAppAction(em: EntityManager, input: AppActionInput, createdBy: string, now: Date, dispatched?: Dispatched[]): Promise<Action> {
  const id = randomUUID();
  const action = em.create(Action, {
    id,
    actionType: input.actionType,
    status: "queued",
    groupSlug: input.groupSlug,
    appName: input.appName,
    branch: input.branch,
    imageTag: input.imageTag ?? null,
    commitMessage: input.commitMessage ?? null,
    commitAuthor: input.commitAuthor ?? null,
    deployWarnings: [],
    serviceName: input.serviceName ?? null,
    action: input.action ?? null,
    payload: {
      ...input.payload,
      // A service action or route reconcile is no deployment: its log lines are found by action_id.
      ...(isDeploymentType(input.actionType) ? { deployment_id: id } : {}),
      app_name: input.appName,
      branch: input.branch,
      group_slug: input.groupSlug,
      image_tag: input.imageTag ?? null,
      purge: input.purge ?? false,
      service_name: input.serviceName ?? null,
      action: input.action ?? null,
    },
    createdBy,
    createdAt: now,
    updatedAt: now,
  });
  // Actions on what runs go to the host where it runs.
  const last = await em.findOne(
    Action,
    { groupSlug: input.groupSlug, appName: input.appName, branch: input.branch, actionType: { $in: ["DEPLOY", "RETRY"] }, status: "completed" },
    { orderBy: { completedAt: "desc" } },
  );
  await dispatch(em, action, now, { preferHost: last?.claimedBy ?? null, dispatched });
  announce(em, action, now);
  return action;
}
