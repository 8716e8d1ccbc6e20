/**
 * Builds (spec doc 1 sections 2.2, 3.1, 4.3): triggering (auto-registration, the preflight gate,
 * tag generation, build_count), reads by id prefix and tag, and following the queue's lifecycle.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { LockMode } from "@mikro-orm/core";
import { PlatformError } from "@platform/errors";
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { canSeeGroup, type Caller } from "@platform/caller";
import { App, Build } from "../entities/index.ts";
import { appNameFrom } from "./naming.ts";
import { normalizeRepository, type RepositoryPolicy } from "./repository.ts";
import { registerApp, registrationHolder } from "./registration.ts";
import { underGroupLock, type GroupLock, type Transact } from "./group-lock.ts";
import { requirePreflightPassed } from "./preflight.ts";
import { applyDeployUpdate, DEPLOY_ACTION_TYPES, type DeployActionUpdate } from "./deploy-state.ts";

export interface TriggerInput {
  appName: string;
  repository: string;
  branch?: string;
  autoDeploy?: boolean;
  configPath?: string;
  skipPreflight?: boolean;
}

export interface BuildRequested {
  build_id: string;
  deploy_action_id: string | null;
  app_name: string;
  branch: string;
  group_slug: string;
  tag: string;
  repository: string;
  config_path: string;
  auto_deploy: boolean;
  created_by: string;
}

/** `{branch}-{hash}`: the branch's hostname label and a short random hex, unique per app. */
export async function generateTag(em: EntityManager, app: App): Promise<string> {
  for (;;) {
    const tag = `${app.branchLabel}-${randomBytes(4).toString("hex")}`;
    if (!(await em.findOne(Build, { appName: app.appName, tag }))) return tag;
  }
}

function visibleGroupFilter(caller: Caller, explicitGroup: boolean): { groupSlug?: string } {
  if (caller.platformOperator && !explicitGroup) return {};
  return { groupSlug: caller.selectedGroup };
}

/**
 * POST /api/builds. A build of a registered app takes no group lock: it holds the app row in
 * share mode instead, so a rename's re-key (group-rename.ts), which updates that row first, waits
 * for this build's row to commit and then moves it too. An unknown app is registered through the
 * same code as POST /api/apps, under the group lock, and built in the same transaction.
 */
export async function triggerBuild(
  deps: { lock: GroupLock; transact: Transact },
  caller: Caller,
  input: TriggerInput,
  policy: RepositoryPolicy,
): Promise<{ build: Build; app: App; registered: boolean }> {
  const baseName = appNameFrom(input.appName);
  const branch = input.branch || "main";
  const group = caller.selectedGroup;
  if (!group || !canSeeGroup(caller, group)) throw PlatformError.invalid("Select the group to build in (?group=).");
  const target = (em: EntityManager, share: boolean) =>
    em.findOne(App, { groupSlug: group, branch, $or: [{ appName: baseName }, { baseName }] }, share ? { lockMode: LockMode.PESSIMISTIC_READ } : {});

  const built = await deps.transact(async (em) => {
    const app = await target(em, true);
    return app ? queueBuild(em, caller, app, input) : null;
  });
  if (built) return { ...built, registered: false };
  return underGroupLock(deps.lock, deps.transact, group, registrationHolder(caller), async (em) => {
    // Registered meanwhile, or found once a rename not yet applied here was caught up with.
    const found = await target(em, false);
    const app = found ?? (await registerApp(em, caller, { appName: input.appName, repository: input.repository, branch, configPath: input.configPath }, policy)).app;
    return { ...(await queueBuild(em, caller, app, input)), registered: !found };
  });
}

/** The build of a registered app: its record (queued), and the request deploy-queue turns into actions. */
async function queueBuild(em: EntityManager, caller: Caller, app: App, input: TriggerInput): Promise<{ build: Build; app: App }> {
  if (normalizeRepository(app.repository) !== normalizeRepository(input.repository)) {
    throw PlatformError.conflict({
      code: "repository_mismatch",
      message: `App '${app.appName}' (branch ${app.branch}) builds from ${app.repository}, not ${input.repository}.`,
      repository: app.repository,
    });
  }
  if (!input.skipPreflight) requirePreflightPassed(app);

  const tag = await generateTag(em, app);
  const autoDeploy = input.autoDeploy ?? true;
  const createdBy = `${caller.kind}:${caller.principalId}`;
  const build = em.create(Build, {
    id: randomUUID(),
    appId: app.id,
    appName: app.appName,
    displayName: app.displayName,
    groupSlug: app.groupSlug,
    branch: app.branch,
    tag,
    status: "queued",
    queueStatus: "queued",
    codebuildPhase: "SUBMITTED",
    images: [],
    autoDeploy,
    deployActionId: autoDeploy ? randomUUID() : null,
    createdBy,
  });
  const event: BuildRequested = {
    build_id: build.id,
    deploy_action_id: build.deployActionId ?? null,
    app_name: app.appName,
    branch: app.branch,
    group_slug: app.groupSlug,
    tag,
    repository: app.repository,
    config_path: app.configPath,
    auto_deploy: autoDeploy,
    created_by: createdBy,
  };
  enqueueEvent(em, subjects.events.buildRequested, { ...event });
  return { build, app };
}

/**
 * build_count (spec 3.1: "build_count incremented" by every accepted build) is the number of the
 * branch's builds rows plus those a purge deleted (`apps.build_count`). Counting rows on read keeps
 * the app row out of POST /api/builds: concurrent builds of one app would otherwise queue on it.
 */
export async function buildCounts(em: EntityManager, apps: App[]): Promise<Map<string, number>> {
  const counts = new Map(apps.map((a) => [a.id, a.buildCount]));
  if (apps.length === 0) return counts;
  const rows = await em
    .getConnection()
    .execute<{ app_id: string; n: number }[]>(
      "select app_id, count(*)::int as n from builds where app_id in (?) group by app_id",
      [apps.map((a) => a.id)],
      "all",
      em.getTransactionContext(),
    );
  for (const r of rows) counts.set(r.app_id, (counts.get(r.app_id) ?? 0) + Number(r.n));
  return counts;
}

const ID_PREFIX = /^[0-9a-f-]{8,36}$/i;

/** Ids may be given as a prefix of at least 8 hex-or-hyphen characters (spec doc 1 section 8). */
export function checkIdPrefix(id: string): string {
  if (!ID_PREFIX.test(id)) {
    throw PlatformError.invalid(`'${id}' is not a build id: give at least 8 characters, hex digits or hyphens only.`);
  }
  return id.toLowerCase();
}

export async function findBuildByPrefix(em: EntityManager, caller: Caller, id: string, explicitGroup = false): Promise<Build | null> {
  const prefix = checkIdPrefix(id);
  const rows = await em
    .getConnection()
    .execute<{ id: string; group_slug: string }[]>("select id, group_slug from builds where id::text like ? limit 50", [`${prefix}%`], "all", em.getTransactionContext());
  const scope = visibleGroupFilter(caller, explicitGroup);
  const visible = rows.filter((r) => canSeeGroup(caller, r.group_slug) && (!scope.groupSlug || r.group_slug === scope.groupSlug));
  if (visible.length === 0) return null;
  if (visible.length > 1) {
    throw PlatformError.conflict({ code: "ambiguous_id", message: `'${id}' matches ${visible.length} builds; give more characters.` });
  }
  return em.findOneOrFail(Build, { id: visible[0]!.id });
}

export function buildNotFound(id: string): PlatformError {
  return PlatformError.notFound(`Build '${id}' not found`);
}

export async function findBuildByTag(em: EntityManager, caller: Caller, appName: string, tag: string): Promise<Build> {
  const build = await em.findOne(Build, { appName, tag });
  if (!build || !canSeeGroup(caller, build.groupSlug) || (!caller.platformOperator && build.groupSlug !== caller.selectedGroup)) {
    throw PlatformError.notFound(`Build '${tag}' of app '${appName}' not found`);
  }
  return build;
}

export interface BuildFilters {
  appName?: string;
  branch?: string;
  since?: string;
  limit: number;
  offset: number;
}

export async function listBuilds(em: EntityManager, caller: Caller, f: BuildFilters, explicitGroup: boolean): Promise<{ items: Build[]; total: number }> {
  if (f.limit < 1 || f.limit > 200) throw PlatformError.invalid("limit must be between 1 and 200.");
  if (f.offset < 0) throw PlatformError.invalid("offset must be 0 or more.");
  const where: Record<string, unknown> = { ...visibleGroupFilter(caller, explicitGroup) };
  if (!caller.platformOperator && !canSeeGroup(caller, caller.selectedGroup)) return { items: [], total: 0 };
  if (f.appName) where.appName = f.appName;
  if (f.branch) where.branch = f.branch;
  if (f.since) {
    const since = new Date(f.since);
    if (Number.isNaN(since.getTime())) throw PlatformError.invalid("since must be an ISO 8601 timestamp.");
    where.createdAt = { $gte: since };
  }
  const [items, total] = await em.findAndCount(Build, where, { orderBy: { createdAt: "desc", id: "asc" }, limit: f.limit, offset: f.offset });
  return { items, total };
}

/** What deploy-queue announces when an action moves (`events.deploy_queue.action_updated`). */
export interface ActionUpdate {
  action_id: string;
  action_type: string;
  status: string;
  queue_status?: string;
  phase?: string | null;
  error_message?: string | null;
  result?: BuildResult | null;
  claimed_at?: string | null;
  completed_at?: string | null;
  app_name?: string;
  branch?: string;
  group_slug?: string;
  image_tag?: string | null;
  build_id?: string | null;
}

/** What the agent reports when a build finishes. */
export interface BuildResult {
  commit_hash?: string;
  commit_message?: string;
  commit_author?: string;
  commit_committed_at?: string;
  images?: string[];
  log?: string;
  /** platform.yaml as authored in the commit built. */
  config?: Record<string, unknown>;
}

const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/**
 * Keeps the builds row in step with its BUILD action: `queue_status` and the phase follow along,
 * while `status` stays `queued` until the build finishes (spec doc 1 section 2.3).
 */
export async function applyActionUpdate(em: EntityManager, update: ActionUpdate): Promise<Build | null> {
  if (DEPLOY_ACTION_TYPES.has(update.action_type) && update.app_name && update.branch && update.group_slug) {
    await applyDeployUpdate(em, update as unknown as DeployActionUpdate);
    return null;
  }
  if (update.action_type !== "BUILD") return null;
  const build = await em.findOne(Build, { id: update.action_id });
  if (!build || TERMINAL.has(build.status)) return build;
  if (update.queue_status) build.queueStatus = update.queue_status;
  if (update.claimed_at && !build.startedAt) {
    build.startedAt = new Date(update.claimed_at);
    build.codebuildPhase = "PROVISIONING";
  }
  if (update.phase && !TERMINAL.has(update.status)) build.codebuildPhase = "BUILD";
  if (!TERMINAL.has(update.status)) return build;

  const completedAt = update.completed_at ? new Date(update.completed_at) : new Date();
  build.status = update.status;
  build.codebuildPhase = "COMPLETED";
  build.completedAt = completedAt;
  if (build.startedAt) build.durationSeconds = Math.max(0, Math.round((completedAt.getTime() - build.startedAt.getTime()) / 1000));
  build.errorMessage = update.status === "failed" ? (update.error_message ?? "The build failed.") : null;
  const r = update.result ?? {};
  build.commitHash = r.commit_hash ?? build.commitHash;
  build.commitMessage = r.commit_message ?? build.commitMessage;
  build.commitAuthor = r.commit_author ?? build.commitAuthor;
  if (r.commit_committed_at) build.commitCommittedAt = new Date(r.commit_committed_at);
  if (r.images) build.images = r.images;
  if (r.log !== undefined) build.log = r.log;
  if (r.config && typeof r.config === "object") build.config = r.config;
  if (update.status === "completed") {
    const app = await em.findOne(App, { id: build.appId });
    if (app) {
      app.latestBuild = build.tag;
      // The base layer is refreshed by each successful build (spec 4.4 config layers).
      if (build.config) {
        app.baseConfig = build.config;
        const services = build.config.services;
        if (services && typeof services === "object") app.serviceNames = Object.keys(services);
      }
    }
  }
  return build;
}
