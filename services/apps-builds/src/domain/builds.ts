/**
 * Builds (spec doc 1 sections 2.2, 3.1, 4.3): triggering (auto-registration, the preflight gate,
 * tag generation, build_count), reads by id prefix and tag, and following the queue's lifecycle.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { PlatformError, checkIdPrefix } from "@platform/errors";
import { LockMode } from "@mikro-orm/core";
import { Coalescer, enqueueEvent, outboxEvent, type EntityManager, type OutboxRow, type Settled, type SqlPool } from "@platform/db";
import { appNameKey, subjects, type BuildRequested } from "@platform/bus";
import { shownRepository } from "@platform/app-config";
import { actorOf, canSeeGroup, inGroup, spansEveryGroup, type Caller } from "@platform/caller";
import { App, Build } from "../entities/index.ts";
import { appNameFrom } from "./naming.ts";
import { normalizeRepository, type RepositoryPolicy } from "./repository.ts";
import { checkConfigPath, registerApp, registrationHolder } from "./registration.ts";
import { underGroupLock, type GroupLock, type Transact } from "./group-lock.ts";
import { quarantinedAtRegistration, requirePreflightPassed } from "./preflight.ts";
import { applyDeployUpdate, DEPLOY_ACTION_TYPES, servingVersion, type DeployActionUpdate } from "./deploy-state.ts";

export interface TriggerInput {
  appName: string;
  repository: string;
  branch?: string;
  autoDeploy?: boolean;
  configPath?: string;
  skipPreflight?: boolean;
}

/** `{branch}-{hash}`: the branch's hostname label and a short random hex, unique per app. */
export function newTag(app: Pick<App, "branchLabel">): string {
  return `${app.branchLabel}-${randomBytes(4).toString("hex")}`;
}

function visibleGroupFilter(caller: Caller): { groupSlug?: string } {
  if (spansEveryGroup(caller)) return {};
  return { groupSlug: caller.selectedGroup };
}

/** What building needs to know of an app: the columns `appForBuild` reads. */
export type BuildableApp = Pick<App, "id" | "appName" | "displayName" | "groupSlug" | "branch" | "branchLabel" | "repository" | "configPath" | "preflightStatus">;

/** A build accepted by POST /api/builds: its row and the event asking deploy-queue for its actions. */
export interface AcceptedBuild {
  row: { id: string; appId: string; appName: string; displayName: string; groupSlug: string; branch: string; tag: string; autoDeploy: boolean; deployActionId: string | null; createdBy: string };
  event: BuildRequested;
}

/** Where the build goes: the caller's group, the branch (default main). */
/**
 * The caller a build acts as. An operator who selected no group builds a registered app in the
 * group that has it (app names are unique across the platform, as other routes find them); a new
 * app still needs the group named (?group=), where buildTarget asks for it.
 */
export async function callerForBuild(em: EntityManager, caller: Caller, appName: string): Promise<Caller> {
  if (!spansEveryGroup(caller)) return caller;
  const rows = await em.find(App, { appName: appNameKey(appName) }, { fields: ["groupSlug"] });
  const groups = [...new Set(rows.map((a) => a.groupSlug))].sort();
  if (groups.length > 1) {
    throw PlatformError.conflict({
      code: "app_in_several_groups",
      message: `App '${appNameKey(appName)}' is registered in groups ${groups.map((g) => `'${g}'`).join(", ")}; name one with ?group=.`,
      groups,
    });
  }
  return groups.length === 1 ? inGroup(caller, groups[0]!) : caller;
}

function buildTarget(caller: Caller, input: TriggerInput): { group: string; branch: string; baseName: string } {
  const group = caller.selectedGroup;
  if (!group || !canSeeGroup(caller, group)) throw PlatformError.invalid("Select the group to build in (?group=).");
  return { group, branch: input.branch?.trim() || "main", baseName: appNameFrom(input.appName) };
}

/**
 * The rules a build of a registered app must pass: the same repository, the same config path
 * when one is sent (it is changed with PATCH, which re-runs the preflight), and preflight (spec 3.3).
 */
function admitBuild(app: BuildableApp, input: TriggerInput): void {
  if (normalizeRepository(app.repository) !== normalizeRepository(input.repository)) {
    throw PlatformError.conflict({
      code: "repository_mismatch",
      message: `App '${app.appName}' (branch ${app.branch}) builds from ${shownRepository(app.repository)}, not ${shownRepository(input.repository)}.`,
      repository: shownRepository(app.repository),
    });
  }
  if (input.configPath && checkConfigPath(input.configPath) !== app.configPath) {
    throw PlatformError.conflict({
      code: "config_path_mismatch",
      message: `App '${app.appName}' (branch ${app.branch}) reads its config from ${app.configPath}; change it with PATCH /api/apps/${app.appName} (the preflight runs again).`,
      config_path: app.configPath,
    });
  }
  if (!input.skipPreflight) requirePreflightPassed(app);
}

/** The queued builds row (a fresh tag) and its build_requested event (spec 3.1). */
export function acceptBuild(app: BuildableApp, caller: Caller, input: TriggerInput): AcceptedBuild {
  const autoDeploy = input.autoDeploy ?? true;
  const createdBy = actorOf(caller);
  const id = randomUUID();
  const tag = newTag(app);
  const deployActionId = autoDeploy ? randomUUID() : null;
  return {
    row: { id, appId: app.id, appName: app.appName, displayName: app.displayName, groupSlug: app.groupSlug, branch: app.branch, tag, autoDeploy, deployActionId, createdBy },
    event: {
      build_id: id,
      deploy_action_id: deployActionId,
      app_name: app.appName,
      branch: app.branch,
      group_slug: app.groupSlug,
      tag,
      repository: app.repository,
      config_path: app.configPath,
      auto_deploy: autoDeploy,
      created_by: createdBy,
      requested_at: new Date().toISOString(),
    },
  };
}

export interface TriggeredBuild {
  buildId: string;
  tag: string;
  /** The app built: the name asked for may be its base name (a suffixed app, `shop-2`). */
  appName: string;
  registered: boolean;
}

const APP_FOR_BUILD = `select id, app_name, display_name, group_slug, branch, branch_label, repository, config_path, preflight_status
  from apps where group_slug = $1 and branch = $2 and (app_name = $3 or base_name = $3) limit 1`;

/**
 * Builds rows and their outbox events in one statement, for any number of builds: each build's
 * row and event are written, or neither, and only while its apps row still holds the values
 * they were made from and the build is admitted. The apps rows are held in share mode
 * meanwhile, as in `triggerBuild`, for a rename's re-key. What it returns is the ids of the
 * builds written. The event names the tag serving when the row was admitted (`previous_tag`, as
 * servingVersion says it).
 */
const INSERT_BUILDS = `with input as (
    select * from unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::boolean[], $9::uuid[], $10::text[],
                         $11::uuid[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::boolean[])
      as i(id, app_id, app_name, display_name, group_slug, branch, tag, auto_deploy, deploy_action_id, created_by,
           event_id, subject, payload, headers, branch_label, repository, config_path, skip_preflight)),
  admitted as (
    select i.*, case when a.deploy_status = 'undeployed' then null else a.running_version end as previous_tag
    from input i join apps a on a.id = i.app_id
    where a.app_name = i.app_name and a.display_name = i.display_name and a.group_slug = i.group_slug and a.branch = i.branch
      and a.branch_label = i.branch_label and a.repository = i.repository and a.config_path = i.config_path
      and (i.skip_preflight or a.preflight_status in ('ready', 'exempt'))
    for share of a),
  b as (
    insert into builds (id, app_id, app_name, display_name, group_slug, branch, tag, status, queue_status, codebuild_phase, auto_deploy, deploy_action_id, created_by)
    select id, app_id, app_name, display_name, group_slug, branch, tag, 'queued', 'queued', 'SUBMITTED', auto_deploy, deploy_action_id, created_by from admitted
    on conflict (app_name, tag) do nothing
    returning id),
  o as (
    insert into outbox (id, subject, payload, headers)
    select i.event_id, i.subject, i.payload::jsonb || jsonb_build_object('previous_tag', i.previous_tag), i.headers::jsonb
    from admitted i join b on b.id = i.id)
  select id from b`;

/** One build for INSERT_BUILDS: its row, its event, and the app values both were made from. */
interface BuildWrite {
  row: AcceptedBuild["row"];
  event: OutboxRow;
  app: BuildableApp;
  skipPreflight: boolean;
}

async function insertBuilds(db: SqlPool, writes: BuildWrite[]): Promise<Set<string>> {
  const column = <T>(f: (w: BuildWrite) => T) => writes.map(f);
  const { rows } = await db.query<{ id: string }>({
    name: "builds-insert",
    text: INSERT_BUILDS,
    values: [
      column((w) => w.row.id), column((w) => w.row.appId), column((w) => w.row.appName), column((w) => w.row.displayName),
      column((w) => w.row.groupSlug), column((w) => w.row.branch), column((w) => w.row.tag), column((w) => w.row.autoDeploy),
      column((w) => w.row.deployActionId), column((w) => w.row.createdBy),
      column((w) => w.event.id), column((w) => w.event.subject), column((w) => JSON.stringify(w.event.payload)), column((w) => JSON.stringify(w.event.headers)),
      column((w) => w.app.branchLabel), column((w) => w.app.repository), column((w) => w.app.configPath), column((w) => w.skipPreflight),
    ],
  });
  return new Set(rows.map((r) => r.id));
}

/**
 * Concurrent POST /api/builds share a statement (and its commit) per pool. A batch that fails
 * (an app deleted under it) is written again build by build, so each build hears its own outcome.
 */
const coalescers = new WeakMap<SqlPool, Coalescer<BuildWrite, boolean>>();

function buildWriter(db: SqlPool): Coalescer<BuildWrite, boolean> {
  let writer = coalescers.get(db);
  if (!writer) {
    const write = async (writes: BuildWrite[]): Promise<Settled<boolean>[]> => {
      try {
        const ids = await insertBuilds(db, writes);
        return writes.map((w) => ({ ok: true, value: ids.has(w.row.id) }));
      } catch (error) {
        if (writes.length === 1) return [{ ok: false, error }];
        return (await Promise.all(writes.map((w) => write([w])))).flat();
      }
    };
    writer = new Coalescer(write, { maxBatch: 64, maxInFlight: 2 });
    coalescers.set(db, writer);
  }
  return writer;
}

/**
 * The apps built lately by this process, by what a request names (group, branch, name): a build
 * is made from the entry at once, and the inserting statement checks it against the apps row,
 * so an entry gone stale costs one more read, never a wrong build.
 */
const builtApps = new Map<string, BuildableApp>();
const BUILT_APPS_MAX = 10_000;
const ATTEMPTS = 5;

/**
 * POST /api/builds of an app that is registered: usually one statement, no ORM unit of work
 * (this is the platform's hottest write). Null when the app is not registered (or was deleted
 * under us): `triggerBuild` registers it and builds in one transaction.
 */
export async function triggerBuildOfRegisteredApp(db: SqlPool, caller: Caller, input: TriggerInput): Promise<TriggeredBuild | null> {
  const { group, branch, baseName } = buildTarget(caller, input);
  const key = `${group}\n${branch}\n${baseName}`;
  const readApp = async (): Promise<BuildableApp | null> => {
    const { rows } = await db.query<Record<string, string>>({ name: "apps-for-build", text: APP_FOR_BUILD, values: [group, branch, baseName] });
    const r = rows[0];
    if (!r) return null;
    return {
      id: r.id!,
      appName: r.app_name!,
      displayName: r.display_name!,
      groupSlug: r.group_slug!,
      branch: r.branch!,
      branchLabel: r.branch_label!,
      repository: r.repository!,
      configPath: r.config_path!,
      preflightStatus: r.preflight_status!,
    };
  };
  let app = builtApps.get(key) ?? null;
  let fresh = app === null;
  if (fresh) app = await readApp();
  for (let attempt = 1; app; attempt++) {
    try {
      admitBuild(app, input);
    } catch (err) {
      // A refusal is only ever said from what the apps row holds now.
      if (fresh) throw err;
      app = await readApp();
      fresh = true;
      continue;
    }
    const { row, event } = acceptBuild(app, caller, input);
    const outbox = outboxEvent(subjects.events.buildRequested, { ...event });
    try {
      if (await buildWriter(db).submit({ row, event: outbox, app, skipPreflight: input.skipPreflight === true })) {
        if (!builtApps.has(key) && builtApps.size >= BUILT_APPS_MAX) builtApps.delete(builtApps.keys().next().value!);
        builtApps.set(key, app);
        return { buildId: row.id, tag: row.tag, appName: app.appName, registered: false };
      }
    } catch (err) {
      if ((err as { code?: string }).code !== FOREIGN_KEY_VIOLATION) throw err;
    }
    // The app changed (or its preflight did) since it was read, or the tag was taken: read it
    // again and let admitBuild say why a build is refused, if it is.
    if (attempt === ATTEMPTS) throw PlatformError.unavailable(`App '${app.appName}' keeps changing; try the build again.`);
    app = await readApp();
    fresh = true;
  }
  builtApps.delete(key);
  return null;
}

const FOREIGN_KEY_VIOLATION = "23503";

/**
 * POST /api/builds through the ORM: for an app `triggerBuildOfRegisteredApp` did not find. An
 * unknown app is registered through the same code as POST /api/apps, under the group lock; with
 * `skip_preflight` it is built in the same transaction, otherwise the build is refused as for any
 * quarantined app while the registration stands. A registered app's row is held in share mode while its build is
 * written, so a rename's re-key (group-rename.ts), which updates that row first, waits for the
 * build's row to commit and then moves it too.
 */
export async function triggerBuild(deps: { lock: GroupLock; transact: Transact }, caller: Caller, input: TriggerInput, policy: RepositoryPolicy): Promise<TriggeredBuild> {
  const { group, branch, baseName } = buildTarget(caller, input);
  const target = (em: EntityManager, share: boolean) =>
    em.findOne(App, { groupSlug: group, branch, $or: [{ appName: baseName }, { baseName }] }, share ? { lockMode: LockMode.PESSIMISTIC_READ } : {});

  const buildRegistered = () =>
    deps.transact(async (em) => {
      const app = await target(em, true);
      return app ? queueBuild(em, caller, app, input) : null;
    });
  const built = await buildRegistered();
  if (built) return { ...built, registered: false };
  let outcome: TriggeredBuild | { quarantined: App };
  try {
    outcome = await underGroupLock(deps.lock, deps.transact, group, registrationHolder(caller), async (em): Promise<TriggeredBuild | { quarantined: App }> => {
      // Registered meanwhile, or found once a rename not yet applied here was caught up with.
      const found = await target(em, false);
      if (found) return { ...(await queueBuild(em, caller, found, input)), registered: false };
      const { app } = await registerApp(em, caller, { appName: input.appName, repository: input.repository, branch, configPath: input.configPath }, policy);
      // A new app starts quarantined (spec 3.3). Its registration and preflight commit all the same,
      // so that the build asked for again once the check has passed finds the app.
      if (!input.skipPreflight) return { quarantined: app };
      return { ...(await queueBuild(em, caller, app, input)), registered: true };
    });
  } catch (err) {
    // Another request registered the app between our look and our registration (the first
    // builds of a new app, sent together): this one is a build of the app that request registered.
    if (!(err instanceof PlatformError && typeof err.detail === "object" && err.detail.code === "app_exists")) throw err;
    const again = await buildRegistered();
    if (!again) throw err;
    return { ...again, registered: false };
  }
  if ("quarantined" in outcome) throw quarantinedAtRegistration(outcome.quarantined);
  return outcome;
}

/** The build of a registered app through the ORM: its row (queued) and its build_requested event. */
async function queueBuild(em: EntityManager, caller: Caller, app: App, input: TriggerInput): Promise<Omit<TriggeredBuild, "registered">> {
  admitBuild(app, input);
  for (;;) {
    const { row, event } = acceptBuild(app, caller, input);
    if (await em.findOne(Build, { appName: row.appName, tag: row.tag })) continue;
    em.create(Build, { ...row, status: "queued", queueStatus: "queued", codebuildPhase: "SUBMITTED", images: [] });
    enqueueEvent(em, subjects.events.buildRequested, { ...event, previous_tag: servingVersion(app) });
    return { buildId: row.id, tag: row.tag, appName: app.appName };
  }
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

export async function findBuildByPrefix(em: EntityManager, caller: Caller, id: string): Promise<Build | null> {
  const prefix = checkIdPrefix(id, "a build id");
  const rows = await em
    .getConnection()
    .execute<{ id: string; group_slug: string }[]>("select id, group_slug from builds where id::text like ? limit 50", [`${prefix}%`], "all", em.getTransactionContext());
  const scope = visibleGroupFilter(caller);
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
  const build = await em.findOne(Build, { appName: appNameKey(appName), tag });
  const scope = visibleGroupFilter(caller);
  if (!build || !canSeeGroup(caller, build.groupSlug) || (scope.groupSlug !== undefined && build.groupSlug !== scope.groupSlug)) {
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

/** ISO 8601 as a date (`2026-11-24`) or a timestamp to the minute or finer, with Z or an offset. */
const ISO_8601 = /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?)?$/i;

/**
 * `since` of GET /api/builds (spec 4.3: ISO 8601). A date is its midnight in UTC, and so is a
 * time without an offset: the platform keeps every time in UTC.
 */
export function parseSince(raw: string): Date {
  const m = ISO_8601.exec(raw.trim());
  const invalid = () => PlatformError.invalid(`since must be an ISO 8601 date or timestamp, such as 2026-11-24 or 2026-11-24T09:30:00Z (got '${raw}').`);
  if (!m) throw invalid();
  const [, y, mo, d, h = "00", mi = "00", sec = "00", fraction = "", zone] = m;
  const offset = zone === undefined || zone.toUpperCase() === "Z" ? "Z" : `${zone.slice(0, 3)}:${zone.slice(-2)}`;
  const at = new Date(`${y}-${mo}-${d}T${h}:${mi}:${sec}${fraction.slice(0, 4)}${offset}`);
  // Date rolls 2026-02-30 over into March: a date that does not exist is refused instead. So is
  // one before year 1, which Postgres has no timestamp for.
  if (Number.isNaN(at.getTime()) || at.getUTCFullYear() < 1 || Number(mo) < 1 || Number(mo) > 12 || Number(d) > new Date(Date.UTC(Number(y), Number(mo), 0)).getUTCDate() || Number(h) > 23 || Number(mi) > 59 || Number(sec) > 59) {
    throw invalid();
  }
  return at;
}

export async function listBuilds(em: EntityManager, caller: Caller, f: BuildFilters): Promise<{ items: Build[]; total: number }> {
  if (f.limit < 1 || f.limit > 200) throw PlatformError.invalid("limit must be between 1 and 200.");
  if (f.offset < 0) throw PlatformError.invalid("offset must be 0 or more.");
  const where: Record<string, unknown> = { ...visibleGroupFilter(caller) };
  if (!caller.platformOperator && !canSeeGroup(caller, caller.selectedGroup)) return { items: [], total: 0 };
  if (f.appName) where.appName = appNameKey(f.appName);
  if (f.branch) where.branch = f.branch;
  if (f.since) where.createdAt = { $gte: parseSince(f.since) };
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

/** `applyActionUpdate` for updates in the order they were announced, the builds rows read at once. */
export async function applyActionUpdates(em: EntityManager, updates: ActionUpdate[]): Promise<void> {
  const buildIds = updates.filter((u) => u.action_type === "BUILD").map((u) => u.action_id);
  // Loaded into the identity map, where applyActionUpdate's lookups by id find them.
  if (buildIds.length > 0) await em.find(Build, { id: { $in: buildIds } });
  for (const update of updates) await applyActionUpdate(em, update);
}

/** Whether a build of the app asked for after `build` has completed already. */
async function newerBuildCompleted(em: EntityManager, app: App, build: Build): Promise<boolean> {
  // The app's latest build as this unit of work holds it (an update earlier in the batch may have set it), then the database.
  const latest = app.latestBuild && app.latestBuild !== build.tag ? await em.findOne(Build, { appId: app.id, tag: app.latestBuild }) : null;
  if (latest && latest.status === "completed" && latest.createdAt > build.createdAt) return true;
  return (await em.count(Build, { appId: app.id, status: "completed", createdAt: { $gt: build.createdAt }, id: { $ne: build.id } })) > 0;
}

/**
 * The build's duration in whole seconds: final once it has ended, so far while it runs, and 0
 * before an agent has taken it (or when it ended without ever starting, cancelled in the queue).
 */
export function buildDuration(build: Pick<Build, "startedAt" | "completedAt" | "durationSeconds">, now: Date): number {
  if (build.durationSeconds !== null && build.durationSeconds !== undefined) return build.durationSeconds;
  if (!build.startedAt) return 0;
  const end = build.completedAt ?? now;
  return Math.max(0, Math.round((end.getTime() - build.startedAt.getTime()) / 1000));
}

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
  // The commit is known once the clone is done, before the build ends (the agent reports it then).
  const r = update.result ?? {};
  build.commitHash = r.commit_hash ?? build.commitHash;
  build.commitMessage = r.commit_message ?? build.commitMessage;
  build.commitAuthor = r.commit_author ?? build.commitAuthor;
  if (r.commit_committed_at) build.commitCommittedAt = new Date(r.commit_committed_at);
  if (!TERMINAL.has(update.status)) return build;

  const completedAt = update.completed_at ? new Date(update.completed_at) : new Date();
  build.status = update.status;
  build.codebuildPhase = "COMPLETED";
  build.completedAt = completedAt;
  build.durationSeconds = buildDuration(build, completedAt);
  build.errorMessage = update.status === "failed" ? (update.error_message ?? "The build failed.") : null;
  if (r.images) build.images = r.images;
  if (r.log !== undefined) build.log = r.log;
  if (r.config && typeof r.config === "object") build.config = r.config;
  if (update.status === "completed") {
    const app = await em.findOne(App, { id: build.appId });
    // Builds finish out of order: the app's latest build, and the base config layer read from it,
    // move only forward (an older commit finishing late must not roll them back).
    if (app && !(await newerBuildCompleted(em, app, build))) {
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
