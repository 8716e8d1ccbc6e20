/**
 * Registering an app (spec doc 1 section 4.4, POST /api/apps): name sanitising with a numeric
 * suffix when another group holds the name, one row per branch, the same-repository rule, and
 * the preflight quarantine every new app starts in. A registration writes under the group lock
 * (group-lock.ts).
 */
import { randomUUID } from "node:crypto";
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { actorOf, canSeeGroup, type Caller } from "@platform/caller";
import { App } from "../entities/index.ts";
import { appNameFrom, branchLabel, checkBranch, checkBranchHostLabel, hostLabelTaken, suffixPatterns, withSuffix } from "./naming.ts";
import { checkRepository, normalizeRepository, type RepositoryPolicy } from "./repository.ts";
import { requeuePreflight } from "./preflight.ts";
import { holdProductionLock } from "./apps.ts";
import { REGISTRATION_SETTINGS } from "@platform/proto";
import { applySettings, checkSeedIsNotThisBranch, parseSeedReference, readAppPatch, SEED_REFERENCE_MAX } from "./app-settings.ts";
import { copyVarsForRegistration } from "./variables.ts";
import { underGroupLock, type GroupLock, type Transact } from "./group-lock.ts";

export interface RegisterInput {
  appName: string;
  repository: string;
  displayName?: string;
  branch?: string;
  description?: string;
  configPath?: string;
  groupSlug?: string;
  /**
   * The deploy settings sent with the registration (REGISTRATION_SETTINGS: deploy_config,
   * services, containers and the feature flags), as the client's JSON; read like a PATCH.
   */
  settings?: unknown;
  gitCloneProvider?: string;
  copyVarsFromBranch?: string;
  cloneDataFromBranch?: string;
  cloneComponents?: { db: boolean; drives: boolean; buckets: boolean };
  seedFromReference?: string;
}

export interface Registered {
  app: App;
  preflightActionId: string;
  copiedVarKeys: string[] | null;
  cloneDataScheduled: NonNullable<App["cloneData"]> | null;
}

/**
 * Components of a data clone when `clone_components` is omitted entirely: the database and the
 * drives (spec 4.4). A `clone_components` object given in part takes each missing key's own
 * default (db true, drives false, buckets false) from the API schema.
 */
export const DEFAULT_CLONE_COMPONENTS = { db: true, drives: true, buckets: false };

export const DEFAULT_CONFIG_PATH = "platform.yaml";

/**
 * Whether every agent can run the data copy clone_data_from_branch schedules (spec doc 1 section
 * 4.4: "503 until every agent can run the copy"). None can: copying a branch's database and
 * drives belongs to the storage work, which the agents of this version do not have.
 */
const AGENTS_RUN_DATA_COPY = false;

/**
 * A config path as stored: relative, inside the repository, without `.` segments, so that
 * `./platform.yaml` is the same file as `platform.yaml` for the same-repository rule.
 */
export const CONFIG_PATH_MAX = 256;

export function checkConfigPath(input: string | undefined): string {
  const parts = ((input ?? "").trim() || DEFAULT_CONFIG_PATH).split("/").filter((part) => part !== ".");
  const path = parts.join("/");
  if (path.length > CONFIG_PATH_MAX) throw PlatformError.invalid({ code: "out_of_range", message: `config_path must be at most ${CONFIG_PATH_MAX} characters.` });
  if (parts.length === 0 || parts.some((part) => part === ".." || part === "")) {
    throw PlatformError.invalid("config_path must be a relative path inside the repository.");
  }
  return path;
}

export const GIT_PROVIDERS = ["github", "gitlab"] as const;

/**
 * `git_clone_provider` clones with the caller's linked account on that provider. Accounts are
 * linked through the sign-in flows (spec 4.2), which this platform does not offer yet, so no
 * caller has one: the field is refused rather than ignored, since a private repository would
 * otherwise fail its preflight with no hint why.
 */
export function checkCloneProvider(caller: Caller, provider: string | undefined): void {
  const name = (provider ?? "").trim();
  if (!name) return;
  if (!(GIT_PROVIDERS as readonly string[]).includes(name)) throw PlatformError.invalid(`git_clone_provider must be one of ${GIT_PROVIDERS.join(", ")}.`);
  if (caller.kind !== "session") {
    throw PlatformError.invalid({
      code: "no_user_session",
      message: `git_clone_provider clones with the signed-in user's linked ${name} account; an API key has none. Register with a repository URL the agents can clone.`,
    });
  }
  throw PlatformError.invalid({
    code: "not_linked",
    message: `You have no linked ${name} account to clone with. Register with a repository URL the agents can clone (public https, or ssh with the host's deploy key).`,
  });
}

/** Who holds a registration's lease on its group, as identity's lease table shows it. */
export function registrationHolder(caller: Caller): string {
  return `apps-builds registration by ${actorOf(caller)}`;
}

/** The group a registration writes in: the one named, else the one the caller acts in. */
export function registrationGroup(caller: Caller, groupSlug: string | undefined): string {
  const named = groupSlug?.trim();
  // Two selectors that disagree are a mistake to point out, not a choice to make for the caller.
  if (named && caller.explicitGroup && caller.selectedGroup && named !== caller.selectedGroup) {
    throw PlatformError.invalid({
      code: "group_selectors_differ",
      message: `group_slug '${named}' and the group selected with ?group= or X-Platform-Group ('${caller.selectedGroup}') differ; send one, or the same in both.`,
    });
  }
  const group = named || caller.selectedGroup;
  if (!group) throw PlatformError.invalid("Select the group to register the app in (group_slug or ?group=).");
  if (!canSeeGroup(caller, group)) throw PlatformError.forbidden(`You are not authorised to register apps in group '${group}'.`);
  return group;
}

/** POST /api/apps: the registration, written under the group lock. */
export function registerUnderGroupLock(
  deps: { lock: GroupLock; transact: Transact },
  caller: Caller,
  input: RegisterInput,
  policy: RepositoryPolicy,
): Promise<Registered> {
  const group = registrationGroup(caller, input.groupSlug);
  return underGroupLock(deps.lock, deps.transact, group, registrationHolder(caller), (em) => registerApp(em, caller, { ...input, groupSlug: group }, policy));
}

/** A transaction-scoped advisory lock: held from here until the registration commits or rolls back. */
async function holdUntilCommit(em: EntityManager, key: string): Promise<void> {
  await em.getConnection().execute("select pg_advisory_xact_lock(hashtext(?))", [key], "all", em.getTransactionContext());
}

/**
 * The name of a new app: its base name, or the next free suffix of it (`shop-2`). A suffix may be
 * the base name of a registration running in another group at the same moment, so it is held as
 * that registration holds its own name, and taken only if still free once held. Name locks are
 * taken after the repository lock, and only from a name to its suffixes, so no two registrations
 * wait for each other in a circle.
 */
async function freeName(em: EntityManager, baseName: string): Promise<string> {
  for (;;) {
    const name = withSuffix(baseName, await hostLabelsTaken(em, baseName, suffixPatterns(baseName)));
    if (name === baseName) return name;
    await holdUntilCommit(em, `apps.register.${name}`);
    if ((await hostLabelsTaken(em, name, [])).size === 0) return name;
  }
}

/**
 * The host labels in use among `label` and the LIKE `patterns`. Front doors share one namespace
 * (front-door.ts): an app answers to its name and each of its branches to `<app>-<branch label>`.
 * Every branch's label counts, the production branch's too, since set-production moves the bare
 * name to another branch. So `shop-dev` is taken once `shop` has a branch `dev`, and the reverse.
 */
export async function hostLabelsTaken(em: EntityManager, label: string, patterns: string[]): Promise<Set<string>> {
  const rows = await em.getConnection().execute<{ label: string }[]>(
    `select label from (select app_name as label from apps union all select app_name || '-' || branch_label from apps) hosts
     where label = ?${" or label like ?".repeat(patterns.length)}`,
    [label, ...patterns],
    "all",
    em.getTransactionContext(),
  );
  return new Set(rows.map((r) => r.label));
}

/**
 * A new branch's host label (`<app>-<branch label>`) must not be one another app answers to. Held
 * as a registration of that name holds it, so a new app of that name cannot take it meanwhile.
 */
async function checkBranchHostFree(em: EntityManager, appName: string, label: string): Promise<void> {
  checkBranchHostLabel(appName, label);
  const host = `${appName}-${label}`;
  await holdUntilCommit(em, `apps.register.${host}`);
  if ((await hostLabelsTaken(em, host, [])).size > 0) throw hostLabelTaken(appName, label);
}

function repositoryLockKey(group: string, repositoryKey: string, configPath: string): string {
  return `apps.register.repository.${group}\n${repositoryKey}\n${configPath}`;
}

function repositoryAlreadyRegistered(group: string, configPath: string, appName: string): PlatformError {
  return PlatformError.conflict({
    code: "repository_already_registered",
    message: `This repository (with config ${configPath}) is already registered in group '${group}' as '${appName}'. Register another branch of that app instead.`,
    app_name: appName,
  });
}

/**
 * The same-repository rule for an app moved to another config file (PATCH config_path): no other
 * app of the group may have the repository with that file, as registration has it for a new app.
 */
export async function checkConfigPathUnclaimed(em: EntityManager, app: App, configPath: string): Promise<void> {
  await holdUntilCommit(em, repositoryLockKey(app.groupSlug, app.repositoryKey, configPath));
  const twin = await em.findOne(App, { groupSlug: app.groupSlug, repositoryKey: app.repositoryKey, configPath, appName: { $ne: app.appName } });
  if (twin) throw repositoryAlreadyRegistered(app.groupSlug, configPath, twin.appName);
}

/** The registration's write, in the transaction of `em` (under the group lock: registerUnderGroupLock). */
export async function registerApp(
  em: EntityManager,
  caller: Caller,
  input: RegisterInput,
  policy: RepositoryPolicy,
): Promise<Registered> {
  const group = registrationGroup(caller, input.groupSlug);
  const settings = input.settings === undefined ? {} : readAppPatch(input.settings, REGISTRATION_SETTINGS);
  checkCloneProvider(caller, input.gitCloneProvider);
  const baseName = appNameFrom(input.appName);
  const branch = checkBranch(input.branch || "main");
  const label = branchLabel(branch);
  const configPath = checkConfigPath(input.configPath);
  checkRepository(input.repository, policy);
  const repositoryKey = normalizeRepository(input.repository);
  const givenDisplayName = (input.displayName ?? "").trim();
  if ([...givenDisplayName].length > 200) throw PlatformError.invalid("display_name must be at most 200 characters.");
  const description = (input.description ?? "").trim();
  if ([...description].length > 2000) throw PlatformError.invalid("description must be at most 2000 characters.");

  // Registrations of one repository in a group are serialised, so the same-repository rule sees
  // a twin registered at the same moment under another name; so are registrations of one name,
  // so two requests cannot take the same name. (In that order, always: see freeName.)
  await holdUntilCommit(em, repositoryLockKey(group, repositoryKey, configPath));
  await holdUntilCommit(em, `apps.register.${baseName}`);

  const ours = await em.find(App, { groupSlug: group, $or: [{ baseName }, { appName: baseName }] }, { orderBy: { createdAt: "asc" } });
  let appName: string;
  // Every branch of the app the name means, whatever name each was registered by (`web` or `web-2`).
  let branches: App[] = [];
  if (ours.length > 0) {
    appName = ours[0]!.appName;
    branches = await em.find(App, { groupSlug: group, appName }, { orderBy: { createdAt: "asc" } });
    if (branches.some((a) => a.branch === branch)) {
      throw PlatformError.conflict({ code: "app_exists", message: `App '${appName}' already has branch '${branch}'.`, app_name: appName, branch });
    }
    const sibling = branches.find((a) => a.branchLabel === label);
    if (sibling) {
      throw PlatformError.conflict({
        code: "branch_collides",
        message: `Branch '${branch}' collides with branch '${sibling.branch}' of '${appName}' once sanitised to '${label}'.`,
        with: sibling.branch,
      });
    }
  } else {
    const twin = await em.findOne(App, { groupSlug: group, repositoryKey, configPath });
    if (twin) throw repositoryAlreadyRegistered(group, configPath, twin.appName);
    appName = await freeName(em, baseName);
  }

  let isProduction = true;
  if (ours.length > 0) {
    // Read under the lock a deletion of the production branch holds: the app has one when this commits.
    await holdProductionLock(em, appName);
    isProduction = (await em.count(App, { appName, isProduction: true })) === 0;
    await checkBranchHostFree(em, appName, label);
  }
  // A new branch is another version of the same project: it keeps the project's name unless given
  // one, and the name it was first registered by, which requests naming the app by it look up.
  const project = branches.find((a) => a.isProduction) ?? branches[0];
  const displayName = givenDisplayName || project?.displayName || input.appName.trim();
  const app = em.create(App, {
    id: randomUUID(),
    appName,
    baseName: branches[0]?.baseName ?? baseName,
    displayName,
    slug: appName,
    groupSlug: group,
    branch,
    branchLabel: label,
    repository: input.repository.trim(),
    repositoryKey,
    configPath,
    description,
    deployStatus: "undeployed",
    visibility: "public",
    isProduction,
    latestBuild: null,
    buildCount: 0,
    databaseEnabled: false,
    cacheEnabled: false,
    emailEnabled: false,
    preflightStatus: "pending",
    preflightResult: null,
    preflightNonce: 0,
    serviceNames: [],
    warnings: [],
    crashLoops: {},
    deployWarning: null,
    primaryOverrides: {},
    baseConfig: null,
    overlay: {},
    seedFromReference: null,
    cloneData: null,
    createdBy: actorOf(caller),
  });
  applySettings(app, settings);
  const siblingOf = async (branchName: string) => em.findOne(App, { appName, branch: branchName, groupSlug: group, id: { $ne: app.id } });

  const seed = input.seedFromReference?.trim();
  const cloneFrom = input.cloneDataFromBranch?.trim();
  if (seed && cloneFrom) {
    throw PlatformError.invalid("seed_from_reference and clone_data_from_branch exclude each other: a first deploy restores from one source.");
  }
  if (seed) {
    if (seed.length > SEED_REFERENCE_MAX) throw PlatformError.invalid(`seed_from_reference must be at most ${SEED_REFERENCE_MAX} characters.`);
    const parsed = parseSeedReference(seed);
    if (!parsed) throw PlatformError.invalid(`seed_from_reference '${seed}' is not of the form <app>:<branch>:<selector>.`);
    checkSeedIsNotThisBranch(seed, parsed, { appName, branch });
    const source = await em.findOne(App, { appName: parsed.app, branch: parsed.branch, groupSlug: group, id: { $ne: app.id } });
    if (!source) throw PlatformError.notFound(`Seed source '${parsed.app}:${parsed.branch}' is not a branch of this app or of an app in group '${group}'.`);
    app.seedFromReference = seed;
  }
  if (cloneFrom) {
    if (!(await siblingOf(cloneFrom))) throw PlatformError.notFound(`Branch '${cloneFrom}' is not a branch of '${appName}' in group '${group}'.`);
    if (app.isProduction) {
      throw PlatformError.conflict({ code: "destination_is_production", message: `Branch '${branch}' would be the production branch of '${appName}'; data is never cloned into production.` });
    }
    const components = input.cloneComponents ?? DEFAULT_CLONE_COMPONENTS;
    if (!components.db && !components.drives && !components.buckets) {
      throw PlatformError.invalid({ code: "nothing_to_clone", message: "clone_components selects nothing to copy: set db, drives or buckets, or register without clone_data_from_branch." });
    }
    app.cloneData = { source_branch: cloneFrom, components };
  }
  const copyFrom = input.copyVarsFromBranch?.trim();
  const copiedVarKeys = copyFrom ? await copyVarsForRegistration(em, app, copyFrom) : null;
  // Refused once every other rule has passed, so the 503 says only what waits on the agents;
  // the transaction rolls back whatever was written.
  if (app.cloneData && !AGENTS_RUN_DATA_COPY) {
    throw PlatformError.unavailable({
      code: "clone_data_unavailable",
      message:
        `The data copy of clone_data_from_branch cannot run yet: no agent of this platform can copy a branch's data, so the branch was not registered. ` +
        `Register it without clone_data_from_branch.`,
      source_branch: app.cloneData.source_branch,
      components: app.cloneData.components,
    });
  }
  const preflightActionId = requeuePreflight(em, app, actorOf(caller));
  return { app, preflightActionId, copiedVarKeys, cloneDataScheduled: app.cloneData ?? null };
}
