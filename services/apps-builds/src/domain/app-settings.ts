/**
 * App settings (spec doc 1 section 4.4): the partial update of an app branch (PATCH), the
 * promotion of a branch to production (set-production), and the config layers as the dashboard
 * reads and saves them.
 *
 * The PATCH body arrives as the JSON the client sent, because its rules are about JSON: an absent
 * field is left unchanged, `null` is accepted only by `seed_from_reference` (it clears it), and an
 * unknown field is refused. Every refusal of the body is a 422 `{code, message, errors}`, checked
 * before anything is read, so nothing is half-applied.
 *
 * Decisions the spec leaves open:
 * - `deploy_config`, `services` and `containers` are stored as sent (bounded in depth and size),
 *   beside the config layers rather than in the overlay: the overlay holds only edits that went
 *   through the save pipeline (validated against the one schema, omissions refused). When a PATCH
 *   sets `deploy_config` and omits a feature flag, the flag is derived from the deploy config's
 *   `database`/`cache`/`email` section when it has one (`{enabled: boolean}`), else kept.
 * - `seed_from_reference` is refused while the branch is running or deploying, and once its first
 *   deploy has happened (the seed is only consumed by a first deploy). Its source
 *   `<app>:<branch>:<selector>` must be a registered branch of this app or of an app in the same
 *   group; anything else is 404.
 * - A `visibility` change is stored at once. The live route follows it at the next deploy (no
 *   reconcile can be queued yet), which is recorded in the app's `warnings` while something may
 *   be serving (deploy_status other than `undeployed`).
 * - `force_remove_domains` is honoured only on the production branch, the one custom domains
 *   attach to: sent true on another branch it is 409 (spec 4.4). On the production branch it has
 *   nothing to do until custom domains exist.
 * - A new `config_path` re-queues the preflight and drops the base layer, read from the old file:
 *   the preflight fills it from the new file, as for a new app, and the next build refreshes it.
 */
import { LockMode } from "@mikro-orm/core";
import { PlatformError } from "@platform/errors";
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { actorOf, type Caller } from "@platform/caller";
import { checkAppConfig, checkConfigBounds, deriveFeatureFlags, renderAppConfigYaml, type AppConfig } from "@platform/app-config";
import { App } from "../entities/index.ts";
import { appBranches, appNotFound, findApp, holdProductionLock } from "./apps.ts";
import { checkBranch, checkBranchHostLabel } from "./naming.ts";
import { requeuePreflight } from "./preflight.ts";
import { CONFIG_PATH_MAX, checkConfigPath, checkConfigPathUnclaimed } from "./registration.ts";
import {
  effectiveConfig,
  readSaveConfigBody,
  saveConfig,
  sourceMap,
  type BaseConfig,
  type JsonObject,
  type Overlay,
  type SourceMap,
} from "./overlay.ts";

/** One reason a request body was refused; `field` names the PATCH field it concerns. */
export interface Problem {
  code: string;
  message: string;
  field?: string;
  path?: string;
  line?: number;
  column?: number;
}

/**
 * Several problems in one sentence: when each message says the same thing of another path (every
 * omitted repository field, say), the paths are listed once; otherwise the messages follow one another.
 */
function summary(problems: Problem[]): string {
  const rests = new Set(problems.map((p) => (p.path !== undefined && p.message.startsWith(`${p.path} `) ? p.message.slice(p.path.length + 1) : null)));
  const [rest] = rests;
  if (rests.size === 1 && rest) return `${problems.length} paths were refused (${problems.map((p) => p.path).join(", ")}): each ${rest}`;
  return `The request was refused for ${problems.length} reasons: ${problems.map((p) => p.message).join(" ")}`;
}

/**
 * The 422 of a refused body: `{code, message, errors}`. `code` is the problems' code when they
 * share one, else `fallback`; `message` is the problem's sentence, or a summary of several.
 */
export function bodyRefusal(problems: Problem[], fallback: string): PlatformError {
  const codes = new Set(problems.map((p) => p.code));
  const code = codes.size === 1 ? problems[0]!.code : fallback;
  const message = problems.length === 1 ? problems[0]!.message : summary(problems);
  return PlatformError.invalid({ code, message, errors: problems });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

// ---------------------------------------------------------------------------------------------
// Seed reference

export const SEED_REFERENCE_MAX = 512;

/** `<app>:<branch>:<selector>`; the selector (a backup or recovery point) may itself hold colons. */
export interface SeedReference {
  app: string;
  branch: string;
  selector: string;
}

const APP_NAME_PART = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const SELECTOR = /^[^\s\x00-\x1f\x7f]+$/;

/** A branch is seeded from another branch's data, never its own (422 `seed_is_this_branch`). */
export function checkSeedIsNotThisBranch(reference: string, parsed: SeedReference, target: { appName: string; branch: string }): void {
  if (parsed.app !== target.appName || parsed.branch !== target.branch) return;
  throw PlatformError.invalid({
    code: "seed_is_this_branch",
    message: `seed_from_reference '${reference}' names this branch itself; a branch is seeded from another branch's data.`,
  });
}

/** The parts of a seed reference, or null when it is not one. */
export function parseSeedReference(reference: string): SeedReference | null {
  const first = reference.indexOf(":");
  const second = first < 0 ? -1 : reference.indexOf(":", first + 1);
  if (second < 0) return null;
  const app = reference.slice(0, first);
  const branch = reference.slice(first + 1, second);
  const selector = reference.slice(second + 1);
  if (!APP_NAME_PART.test(app) || !SELECTOR.test(selector)) return null;
  try {
    if (checkBranch(branch) !== branch) return null;
  } catch {
    return null;
  }
  return { app, branch, selector };
}

// ---------------------------------------------------------------------------------------------
// PATCH

export const VISIBILITIES = ["public", "private"] as const;
export type Visibility = (typeof VISIBILITIES)[number];

/** A PATCH body that passed every check: only the fields that were sent. */
export interface AppPatch {
  displayName?: string;
  description?: string;
  configPath?: string;
  deployConfig?: Record<string, unknown>;
  services?: unknown[];
  containers?: unknown[];
  databaseEnabled?: boolean;
  cacheEnabled?: boolean;
  emailEnabled?: boolean;
  /** `{reference: null}` clears it. */
  seedFromReference?: { reference: string; parsed: SeedReference } | null;
  visibility?: Visibility;
  forceRemoveDomains?: boolean;
}

export const PATCH_FIELDS = [
  "display_name",
  "description",
  "config_path",
  "deploy_config",
  "services",
  "containers",
  "database_enabled",
  "cache_enabled",
  "email_enabled",
  "seed_from_reference",
  "visibility",
  "force_remove_domains",
] as const;
type PatchField = (typeof PATCH_FIELDS)[number];

const DISPLAY_NAME_MAX = 200;
const DESCRIPTION_MAX = 2000;

/**
 * Reads a PATCH body, or the settings of a registration (`accepted`: REGISTRATION_SETTINGS);
 * throws the 422 listing every problem it has.
 */
export function readAppPatch(body: unknown, accepted: readonly PatchField[] = PATCH_FIELDS): AppPatch {
  if (!isObject(body)) {
    throw bodyRefusal([{ code: "invalid_body", message: "The body must be a JSON object of the fields to change." }], "invalid_patch");
  }
  const problems: Problem[] = [];
  const patch: AppPatch = {};
  const refuse = (field: string, code: string, message: string) => problems.push({ code, message, field });

  for (const field of Object.keys(body)) {
    if (!(accepted as readonly string[]).includes(field)) {
      refuse(field, "unknown_field", `${field} is not a field an app update accepts (accepted: ${accepted.join(", ")}).`);
    }
  }

  const text = (field: PatchField, max: number, onValue: (value: string) => void) => {
    const value = body[field];
    if (typeof value !== "string") return refuse(field, "wrong_type", `${field} must be a string.`);
    const trimmed = value.trim();
    // Characters as the OpenAPI maxLength counts them: code points, so an emoji is one.
    if ([...trimmed].length > max) return refuse(field, "out_of_range", `${field} must be at most ${max} characters.`);
    onValue(trimmed);
  };
  const flag = (field: PatchField, onValue: (value: boolean) => void) => {
    const value = body[field];
    if (typeof value !== "boolean") return refuse(field, "wrong_type", `${field} must be true or false.`);
    onValue(value);
  };
  const bounded = (field: PatchField, value: unknown): boolean => {
    const bounds = checkConfigBounds(value);
    for (const p of bounds) refuse(field, p.code, `${field}: ${p.message}`);
    return bounds.length === 0;
  };

  for (const field of PATCH_FIELDS) {
    if (!Object.hasOwn(body, field)) continue;
    const value = body[field];
    if (value === null && field !== "seed_from_reference") {
      refuse(field, "null_not_allowed", `${field} cannot be null: omit it to leave it unchanged (only seed_from_reference accepts null, to clear it).`);
      continue;
    }
    switch (field) {
      case "display_name":
        text(field, DISPLAY_NAME_MAX, (v) => {
          if (!v) refuse(field, "invalid_value", "display_name must not be empty.");
          else patch.displayName = v;
        });
        break;
      case "description":
        text(field, DESCRIPTION_MAX, (v) => (patch.description = v));
        break;
      case "config_path":
        text(field, CONFIG_PATH_MAX, (v) => {
          try {
            if (!v) throw PlatformError.invalid("config_path must be a relative path inside the repository.");
            patch.configPath = checkConfigPath(v);
          } catch (err) {
            refuse(field, "invalid_value", err instanceof Error ? err.message : String(err));
          }
        });
        break;
      case "deploy_config":
        if (!isObject(value)) refuse(field, "wrong_type", "deploy_config must be an object.");
        else if (bounded(field, value)) patch.deployConfig = value;
        break;
      case "services":
      case "containers":
        if (!Array.isArray(value)) refuse(field, "wrong_type", `${field} must be an array.`);
        else if (bounded(field, value)) patch[field] = value;
        break;
      case "database_enabled":
        flag(field, (v) => (patch.databaseEnabled = v));
        break;
      case "cache_enabled":
        flag(field, (v) => (patch.cacheEnabled = v));
        break;
      case "email_enabled":
        flag(field, (v) => (patch.emailEnabled = v));
        break;
      case "force_remove_domains":
        flag(field, (v) => (patch.forceRemoveDomains = v));
        break;
      case "visibility":
        if (typeof value !== "string" || !(VISIBILITIES as readonly string[]).includes(value)) {
          refuse(field, "invalid_value", "visibility must be public or private.");
        } else patch.visibility = value as Visibility;
        break;
      case "seed_from_reference": {
        if (value === null) {
          patch.seedFromReference = null;
          break;
        }
        if (typeof value !== "string") {
          refuse(field, "wrong_type", "seed_from_reference must be a string <app>:<branch>:<selector>, or null to clear it.");
          break;
        }
        if (value.length > SEED_REFERENCE_MAX) {
          refuse(field, "out_of_range", `seed_from_reference must be at most ${SEED_REFERENCE_MAX} characters.`);
          break;
        }
        const parsed = parseSeedReference(value);
        if (!parsed) refuse(field, "invalid_format", `seed_from_reference '${value}' is not of the form <app>:<branch>:<selector>.`);
        else patch.seedFromReference = { reference: value, parsed };
        break;
      }
    }
  }
  if (problems.length > 0) throw bodyRefusal(problems, "invalid_patch");
  return patch;
}

/** A RECONCILE_ROUTING of the branch's live route, queued through the outbox in `em`'s transaction. */
function requestReconcile(em: EntityManager, caller: Caller, app: App): void {
  enqueueEvent(em, subjects.events.reconcileRequested, { app_name: app.appName, branch: app.branch, group_slug: app.groupSlug, requested_by: actorOf(caller) });
}

/** The app row again, locked for this transaction and freshly read (no lost concurrent update). */
export async function lockApp(em: EntityManager, app: App): Promise<App> {
  const locked = await em.findOne(App, { id: app.id }, { lockMode: LockMode.PESSIMISTIC_WRITE, refresh: true });
  // Deleted since it was found (a DELETE racing this request): as unknown as if it came after.
  if (!locked) throw appNotFound(app.appName, app.branch);
  return locked;
}

const FEATURE_FLAGS = [
  ["database", "databaseEnabled", "database_enabled"],
  ["cache", "cacheEnabled", "cache_enabled"],
  ["email", "emailEnabled", "email_enabled"],
] as const;

/**
 * The deploy settings of a PATCH or a registration: `deploy_config`, `services` and `containers`
 * as sent, and the feature flags, sent or derived from the deploy config's sections.
 */
export function applySettings(app: App, patch: AppPatch): void {
  if (patch.deployConfig !== undefined) {
    app.deployConfig = patch.deployConfig;
    const derived = deriveFeatureFlags(patch.deployConfig as AppConfig);
    for (const [section, property, field] of FEATURE_FLAGS) {
      const toggle = patch.deployConfig[section];
      if (patch[property] === undefined && isObject(toggle) && typeof toggle.enabled === "boolean") app[property] = derived[field];
    }
  }
  if (patch.services !== undefined) app.deployServices = patch.services;
  if (patch.containers !== undefined) app.deployContainers = patch.containers;
  for (const [, property] of FEATURE_FLAGS) {
    const value = patch[property];
    if (value !== undefined) app[property] = value;
  }
}

/**
 * PATCH /api/apps/{app_name}?branch=: applies a body read by `readAppPatch`. 404 for an unknown
 * app or branch (another group's included); 409 `app_running` for a seed reference on a running
 * branch, `already_seeded` on one whose first deploy has happened, `clone_data_scheduled` on one
 * registered with clone_data_from_branch; 404 when the seed's source is
 * not this app or an app of the same group.
 */
export async function updateApp(
  em: EntityManager,
  caller: Caller,
  appName: string,
  branch: string | undefined,
  body: unknown,
): Promise<{ app: App; preflightActionId: string | null }> {
  const patch = readAppPatch(body);
  const app = await lockApp(em, await findApp(em, caller, appName, branch));

  if (patch.forceRemoveDomains && !app.isProduction) {
    throw PlatformError.conflict({
      code: "force_on_non_owning_branch",
      message: `force_remove_domains is honoured only on the production branch, which owns the app's custom domains; '${app.branch}' is not '${app.appName}''s production branch.`,
      branch: app.branch,
    });
  }
  const seed = patch.seedFromReference;
  if (seed) {
    if (app.deployStatus === "running" || app.deployStatus === "deploying") {
      throw PlatformError.conflict({
        code: "app_running",
        message: `Branch '${app.branch}' of '${app.appName}' is ${app.deployStatus}; a seed is consumed only by a first deploy, so it cannot be set now.`,
        deploy_status: app.deployStatus,
      });
    }
    if (app.firstDeployedAt) {
      throw PlatformError.conflict({
        code: "already_seeded",
        message: `Branch '${app.branch}' of '${app.appName}' had its first deploy on ${app.firstDeployedAt.toISOString()}; a seed is consumed only by a first deploy, so it cannot be set now.`,
        first_deployed_at: app.firstDeployedAt.toISOString(),
      });
    }
    if (app.cloneData) {
      // As at registration, where the two exclude each other: a first deploy restores from one source.
      throw PlatformError.conflict({
        code: "clone_data_scheduled",
        message: `Branch '${app.branch}' of '${app.appName}' has a data copy from branch '${app.cloneData.source_branch}' scheduled for its first deploy; a first deploy restores from one source, so a seed cannot be set too.`,
        clone_data_from_branch: app.cloneData.source_branch,
      });
    }
    checkSeedIsNotThisBranch(seed.reference, seed.parsed, app);
    const source = await em.findOne(App, { appName: seed.parsed.app, branch: seed.parsed.branch, groupSlug: app.groupSlug });
    if (!source) {
      throw PlatformError.notFound(
        `Seed source '${seed.parsed.app}:${seed.parsed.branch}' is not a branch of this app or of an app in group '${app.groupSlug}'.`,
      );
    }
  }

  if (patch.displayName !== undefined) app.displayName = patch.displayName;
  if (patch.description !== undefined) app.description = patch.description;
  applySettings(app, patch);
  if (seed !== undefined) app.seedFromReference = seed ? seed.reference : null;
  if (patch.visibility !== undefined && patch.visibility !== app.visibility) {
    app.visibility = patch.visibility;
    // The reconcile is queued through the outbox, in this transaction: it cannot be lost.
    if (app.deployStatus !== "undeployed") requestReconcile(em, caller, app);
  }

  let preflightActionId: string | null = null;
  if (patch.configPath !== undefined && patch.configPath !== app.configPath) {
    await checkConfigPathUnclaimed(em, app, patch.configPath);
    app.configPath = patch.configPath;
    app.baseConfig = null;
    preflightActionId = requeuePreflight(em, app, actorOf(caller));
  }
  return { app, preflightActionId };
}

// ---------------------------------------------------------------------------------------------
// set-production

export interface SetProductionResult {
  appName: string;
  branch: string;
  /** The production branch before the call (the branch itself for a no-op); null when none. */
  previousProductionBranch: string | null;
  /** False when the branch already was production: nothing was written. */
  changed: boolean;
}

/**
 * POST /api/apps/{app_name}/set-production?branch=: one production branch per app (a unique
 * partial index holds it), handed over in one transaction: the old one is cleared first.
 * Promotions of one app are serialised so that two of them cannot race into the index.
 */
export async function setProductionBranch(em: EntityManager, caller: Caller, appName: string, branch: string): Promise<SetProductionResult> {
  if (!branch.trim()) {
    throw PlatformError.invalid({ code: "branch_required", message: "Name the branch to promote with ?branch=." });
  }
  await holdProductionLock(em, appName);
  const rows = await appBranches(em, caller, appName);
  const target = rows.find((a) => a.branch === branch);
  if (!target) throw appNotFound(appName, branch);
  if (target.isProduction) return { appName: target.appName, branch, previousProductionBranch: branch, changed: false };

  const previous = await em.findOne(App, { appName: target.appName, isProduction: true });
  if (previous) {
    // The demoted branch is served at <app>-<branch label> from now on: it must fit a host label.
    checkBranchHostLabel(
      previous.appName,
      previous.branchLabel,
      `The production branch '${previous.branch}' would be served there once demoted, so it cannot be demoted; a branch with a shorter name can take its place.`,
    );
    previous.isProduction = false;
    await em.flush();
  }
  target.isProduction = true;
  await em.flush();
  // The front doors swap (<app> and <app>-<branch label>): each deployed branch's route is
  // re-asserted, queued through the outbox in this transaction.
  for (const app of [previous, target]) {
    if (app && app.deployStatus !== "undeployed") requestReconcile(em, caller, app);
  }
  return { appName: target.appName, branch, previousProductionBranch: previous?.branch ?? null, changed: true };
}

// ---------------------------------------------------------------------------------------------
// Config layers

export interface ConfigLayers {
  appName: string;
  branch: string;
  configPath: string;
  /** The repository's config as last read, or null. */
  base: JsonObject | null;
  overlay: Overlay;
  /** Null when there is no config at all (no base, no overlay). */
  effective: JsonObject | null;
  sourceMap: SourceMap;
  /** Null when there is no config, or the effective config is not valid (nothing faithful to render). */
  effectiveYaml: string | null;
}

/** The effective config as YAML, or null when it fails the schema or cannot be rendered. */
function renderEffective(effective: JsonObject): string | null {
  const checked = checkAppConfig(effective);
  if (!checked.ok) return null;
  try {
    return renderAppConfigYaml(checked.config);
  } catch {
    return null;
  }
}

export function configLayers(app: App): ConfigLayers {
  const base = (app.baseConfig ?? null) as JsonObject | null;
  const overlay = (app.overlay ?? {}) as Overlay;
  const hasConfig = base !== null || Object.keys(overlay).length > 0;
  const merged = hasConfig ? effectiveConfig(base as BaseConfig, overlay) : null;
  // Settings of a service no layer declares (a scale saved before the repository's config went
  // unreadable, say) wait in the overlay for a base that declares it; alone they are no config.
  const effective = merged && Object.keys(merged).length > 0 ? merged : null;
  return {
    appName: app.appName,
    branch: app.branch,
    configPath: app.configPath,
    base,
    overlay,
    effective,
    sourceMap: hasConfig ? sourceMap(base as BaseConfig, overlay) : {},
    effectiveYaml: effective ? renderEffective(effective) : null,
  };
}

/** GET /api/apps/{app_name}/config?branch=. */
export async function readConfigLayers(em: EntityManager, caller: Caller, appName: string, branch?: string): Promise<ConfigLayers> {
  return configLayers(await findApp(em, caller, appName, branch));
}

export interface SavedConfig {
  app: App;
  overlay: Overlay;
  changedPaths: string[];
  appliesLive: boolean;
  requiresRedeploy: boolean;
  preflightActionId: string;
}

/**
 * PUT /api/apps/{app_name}/config?branch=: the save pipeline of `saveConfig` over the stored
 * layers (a null base: everything submitted is dashboard-authored). Every refusal is a 422
 * `{code, message, errors}`. A save stores the new overlay, bumps the preflight nonce and
 * re-queues the preflight.
 */
export async function saveAppConfig(em: EntityManager, caller: Caller, appName: string, branch: string | undefined, body: unknown): Promise<SavedConfig> {
  const read = readSaveConfigBody(body);
  if (!read.ok) throw bodyRefusal(read.errors, "config_invalid");
  const app = await lockApp(em, await findApp(em, caller, appName, branch));
  const result = saveConfig((app.baseConfig ?? null) as BaseConfig, (app.overlay ?? {}) as Overlay, read.submitted, { locate: read.locate });
  if (!result.ok) throw bodyRefusal(result.errors, "config_invalid");
  app.overlay = result.overlay;
  const preflightActionId = requeuePreflight(em, app, actorOf(caller));
  return {
    app,
    overlay: result.overlay,
    changedPaths: result.changedPaths,
    appliesLive: result.appliesLive,
    requiresRedeploy: result.requiresRedeploy,
    preflightActionId,
  };
}
