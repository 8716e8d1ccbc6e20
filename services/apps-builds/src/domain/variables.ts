/**
 * Environment variables of an app branch (spec doc 2 section 4.6): read, merge, remove one key,
 * copy-preview and copy-from-branch with its `expected_updated_at` guard, plus the
 * `copy_vars_from_branch` rule of registration (doc 1 section 4.4). Values take effect at the
 * branch's next deploy; nothing here touches a running app.
 *
 * The variables document of a branch carries one stamp (`updated_at`, `updated_by`) for the
 * whole document. The stamp is null while the branch has no variables. Every write that
 * changes the document moves it forward by at least one millisecond (it is stored at
 * millisecond precision), so a stamp names exactly one state of the document: a copy whose
 * `expected_updated_at` differs from the current stamp was previewed against another state.
 *
 * Another group's app is "not found", exactly like an unknown one (`findApp`, `appBranches`).
 */
import { PlatformError } from "@platform/errors";
import { audit, type EntityManager } from "@platform/db";
import { actorOf, type Caller } from "@platform/caller";
import { App } from "../entities/index.ts";
import { Variable, VariableSet } from "../entities/variables.ts";
import { appBranches, appNotFound, findApp } from "./apps.ts";

/** The branch the variables routes act on when none is named (spec: "branch defaults to main"). */
export const DEFAULT_VARIABLES_BRANCH = "main";
export const KEY_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;
export const MAX_KEY_LENGTH = 256;
/** UTF-8 bytes of one value. */
export const MAX_VALUE_BYTES = 32 * 1024;
export const MAX_KEYS_PER_BRANCH = 500;
export const ON_CONFLICT = ["skip", "overwrite"] as const;
export type OnConflict = (typeof ON_CONFLICT)[number];

/** The variables document of one branch. */
export interface VariablesDocument {
  appName: string;
  branch: string;
  variables: Record<string, string>;
  /** Null while the branch has no variables. */
  updatedAt: Date | null;
  updatedBy: string | null;
}

export interface CopyPreview {
  appName: string;
  branch: string;
  sourceBranch: string;
  /** Source keys the destination lacks. */
  new: string[];
  /** Source keys the destination has with the same value. */
  identical: string[];
  /** Source keys the destination has with another value. */
  conflict: string[];
  destinationUpdatedAt: Date | null;
}

export interface CopyInput {
  /** The destination branch. */
  branch: string;
  sourceBranch: string;
  /** Empty: skip. */
  onConflict?: string;
  /** Copy only these source keys; absent or empty: every source key. */
  keys?: string[];
  /** The copy-preview's `destination_updated_at`, exactly as previewed (null when it was null). */
  expectedUpdatedAt: string | null | undefined;
}

export interface CopyResult {
  appName: string;
  branch: string;
  sourceBranch: string;
  /** Keys the destination did not have. */
  copied: string[];
  /** Conflicting keys replaced by the source value (on_conflict overwrite). */
  overwritten: string[];
  /** Conflicting keys left as they were (on_conflict skip), and keys whose value was already identical. */
  skipped: string[];
  destinationUpdatedAt: Date | null;
}

const quoted = (s: string) => `'${s.length > 64 ? `${s.slice(0, 64)}...` : s}'`;
const byName = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/** Key rule: a shell-style name of at most 256 characters. */
export function checkKey(key: unknown): string {
  if (typeof key !== "string" || key.length === 0) throw PlatformError.invalid("A variable name must be a non-empty string.");
  if (key.length > MAX_KEY_LENGTH) throw PlatformError.invalid(`Variable name ${quoted(key)} is longer than ${MAX_KEY_LENGTH} characters.`);
  // `__proto__` matches the pattern but cannot be a plain key of a JSON object on every path.
  if (!KEY_PATTERN.test(key) || key === "__proto__") {
    throw PlatformError.invalid(
      `Variable name ${quoted(key)} is invalid: use letters, digits and underscores, not starting with a digit.`,
    );
  }
  return key;
}

/**
 * Names the platform sets in every replica's environment itself (PORT, the port the replica must
 * listen on; PLATFORM_APP and the other PLATFORM_ names): a variable of that name would never
 * reach the app, so it is refused when set (it may still be deleted).
 */
function isReservedKey(key: string): boolean {
  return key === "PORT" || key.startsWith("PLATFORM_");
}

function checkSettableKey(key: unknown): string {
  const name = checkKey(key);
  if (isReservedKey(name)) {
    throw PlatformError.invalid(`Variable name ${quoted(name)} is reserved: the platform sets PORT and every PLATFORM_ name in each replica's environment itself.`);
  }
  return name;
}

/** Value rule: a string of at most 32 KiB (UTF-8) without NUL characters. */
export function checkValue(key: string, value: unknown): string {
  if (typeof value !== "string") throw PlatformError.invalid(`The value of ${quoted(key)} must be a string.`);
  if (Buffer.byteLength(value, "utf8") > MAX_VALUE_BYTES) {
    throw PlatformError.invalid(`The value of ${quoted(key)} is larger than ${MAX_VALUE_BYTES / 1024} KiB.`);
  }
  if (value.includes("\u0000")) throw PlatformError.invalid(`The value of ${quoted(key)} contains a NUL character.`);
  return value;
}

/**
 * What a branch's variables may add up to (`NAME=value` each, in UTF-8). A replica's environment
 * holds them all, and the kernel refuses to start a process whose environment and arguments pass
 * about 2 MiB (E2BIG): 500 values of 32 KiB would never deploy. 1 MiB leaves room for the rest.
 */
export const MAX_BRANCH_BYTES = 1024 * 1024;

/** The count and size rules of a branch's variables as a write would leave them: its rows, then `writes` over them. */
function checkBranchAfter(rows: Map<string, { value: string }>, writes: Iterable<readonly [string, string]>, branch: string): void {
  const values = new Map([...rows].map(([k, r]) => [k, r.value]));
  for (const [k, v] of writes) values.set(k, v);
  if (values.size > MAX_KEYS_PER_BRANCH) {
    throw PlatformError.invalid(`Branch '${branch}' would have ${values.size} variables; at most ${MAX_KEYS_PER_BRANCH} are allowed.`);
  }
  let bytes = 0;
  for (const [k, v] of values) bytes += Buffer.byteLength(k, "utf8") + 1 + Buffer.byteLength(v, "utf8");
  if (bytes > MAX_BRANCH_BYTES) {
    throw PlatformError.invalid({
      code: "variables_too_large",
      message: `Branch '${branch}' would hold ${Math.ceil(bytes / 1024)} KiB of variables (names and values); at most ${MAX_BRANCH_BYTES / 1024} KiB fit in a replica's environment.`,
    });
  }
}

const branchOrDefault = (branch: string | undefined) => branch || DEFAULT_VARIABLES_BRANCH;

/**
 * Serialises the writes to one branch's variables for the rest of the transaction, so a guard
 * checked here still holds when the transaction commits.
 */
async function lockVariables(em: EntityManager, app: App): Promise<void> {
  await em
    .getConnection()
    .execute("select pg_advisory_xact_lock(hashtext(?))", [`apps.variables.${app.id}`], "all", em.getTransactionContext());
}

interface Loaded {
  set: VariableSet | null;
  rows: Map<string, Variable>;
}

/**
 * The stamp is read before the rows: a write committed in between leaves the stamp older than
 * the rows, so a copy guarded by it is refused instead of applied to a state never previewed.
 */
async function loadVariables(em: EntityManager, app: App): Promise<Loaded> {
  const set = await em.findOne(VariableSet, { appId: app.id });
  const rows = await em.find(Variable, { appId: app.id });
  rows.sort((a, b) => byName(a.key, b.key));
  return { set, rows: new Map(rows.map((r) => [r.key, r])) };
}

function stampOf(loaded: Loaded): Date | null {
  return loaded.rows.size > 0 && loaded.set ? loaded.set.updatedAt : null;
}

function documentOf(app: App, loaded: Loaded): VariablesDocument {
  const stamped = loaded.rows.size > 0 && loaded.set;
  return {
    appName: app.appName,
    branch: app.branch,
    variables: Object.fromEntries([...loaded.rows.values()].map((r) => [r.key, r.value])),
    updatedAt: stamped ? loaded.set!.updatedAt : null,
    updatedBy: stamped ? loaded.set!.updatedBy : null,
  };
}

/** Moves the document's stamp forward (at least one millisecond) and returns it. */
function restamp(em: EntityManager, app: App, loaded: Loaded, actor: string): Date {
  const now = Date.now();
  if (!loaded.set) {
    loaded.set = em.create(VariableSet, { appId: app.id, updatedAt: new Date(now), updatedBy: actor });
  } else {
    loaded.set.updatedAt = new Date(Math.max(now, loaded.set.updatedAt.getTime() + 1));
    loaded.set.updatedBy = actor;
  }
  return loaded.set.updatedAt;
}

function setVariable(em: EntityManager, app: App, loaded: Loaded, key: string, value: string, at: Date): void {
  const row = loaded.rows.get(key);
  if (row) {
    row.value = value;
    row.updatedAt = at;
  } else {
    loaded.rows.set(key, em.create(Variable, { appId: app.id, key, value, updatedAt: at }));
  }
}

/** GET /api/vars/{app_name}?branch=: the document, with an empty object when there are none. */
export async function getVariables(em: EntityManager, caller: Caller, appName: string, branch?: string): Promise<VariablesDocument> {
  const app = await findApp(em, caller, appName, branchOrDefault(branch));
  return documentOf(app, await loadVariables(em, app));
}

/**
 * PUT /api/vars/{app_name}: merges `variables` into the branch's (keys not named are kept).
 * Every name and value is checked before anything is written; a request that changes nothing
 * leaves the stamp as it was.
 */
export async function putVariables(
  em: EntityManager,
  caller: Caller,
  appName: string,
  branch: string | undefined,
  variables: Record<string, unknown>,
): Promise<VariablesDocument> {
  const app = await findApp(em, caller, appName, branchOrDefault(branch));
  const entries = Object.entries(variables).map(([k, v]) => [checkSettableKey(k), checkValue(k, v)] as const);
  await lockVariables(em, app);
  const loaded = await loadVariables(em, app);
  const changed = entries.filter(([k, v]) => loaded.rows.get(k)?.value !== v);
  if (changed.length > 0) {
    checkBranchAfter(loaded.rows, changed, app.branch);
    const at = restamp(em, app, loaded, actorOf(caller));
    for (const [k, v] of changed) setVariable(em, app, loaded, k, v, at);
  }
  return documentOf(app, loaded);
}

/** DELETE /api/vars/{app_name}: removes one key; a key the branch does not have is 404. */
export async function deleteVariable(
  em: EntityManager,
  caller: Caller,
  appName: string,
  branch: string | undefined,
  key: string,
): Promise<VariablesDocument> {
  const app = await findApp(em, caller, appName, branchOrDefault(branch));
  checkKey(key);
  await lockVariables(em, app);
  const loaded = await loadVariables(em, app);
  const row = loaded.rows.get(key);
  if (!row) throw PlatformError.notFound(`Variable ${quoted(key)} is not set on branch '${app.branch}' of '${app.appName}'.`);
  em.remove(row);
  loaded.rows.delete(key);
  restamp(em, app, loaded, actorOf(caller));
  return documentOf(app, loaded);
}

/**
 * The two branches of a copy. Both must be registered on the app in the caller's group (404),
 * differ (422), and the destination must not be the production branch: production can be
 * copied from, never into (409).
 */
async function copyBranches(
  em: EntityManager,
  caller: Caller,
  appName: string,
  branch: string,
  sourceBranch: string,
): Promise<{ destination: App; source: App }> {
  const rows = await appBranches(em, caller, appName);
  if (!branch) throw PlatformError.invalid("Name the destination branch (branch).");
  if (!sourceBranch) throw PlatformError.invalid("Name the branch to copy from (source_branch).");
  if (branch === sourceBranch) {
    throw PlatformError.invalid({ code: "same_branch", message: `Source and destination are the same branch '${branch}'.` });
  }
  const destination = rows.find((a) => a.branch === branch);
  if (!destination) throw appNotFound(appName, branch);
  const source = rows.find((a) => a.branch === sourceBranch);
  if (!source) throw appNotFound(appName, sourceBranch);
  if (destination.isProduction) {
    throw PlatformError.conflict({
      code: "destination_is_production",
      message: `Branch '${branch}' is the production branch of '${appName}': production can be copied from, never into.`,
    });
  }
  return { destination, source };
}

/** GET /api/vars/{app_name}/copy-preview?from=&branch=: what a copy would do, key names only. */
export async function copyPreview(
  em: EntityManager,
  caller: Caller,
  appName: string,
  branch: string | undefined,
  sourceBranch: string,
): Promise<CopyPreview> {
  const { destination, source } = await copyBranches(em, caller, appName, branchOrDefault(branch), sourceBranch);
  const into = await loadVariables(em, destination);
  const from = await loadVariables(em, source);
  const preview: CopyPreview = {
    appName: destination.appName,
    branch: destination.branch,
    sourceBranch: source.branch,
    new: [],
    identical: [],
    conflict: [],
    destinationUpdatedAt: stampOf(into),
  };
  for (const [key, row] of from.rows) {
    const existing = into.rows.get(key);
    if (!existing) preview.new.push(key);
    else if (existing.value === row.value) preview.identical.push(key);
    else preview.conflict.push(key);
  }
  return preview;
}

/** The guard's value: null, or an instant at millisecond precision. */
function parseExpected(expected: string | null | undefined): number | null {
  if (expected === null || expected === undefined || expected === "") return null;
  const ms = Date.parse(expected);
  if (Number.isNaN(ms) || !/^\d{4}-\d{2}-\d{2}T/.test(expected)) {
    throw PlatformError.invalid("expected_updated_at must be the destination_updated_at of the copy-preview, sent exactly as previewed (or null).");
  }
  return ms;
}

/**
 * POST /api/vars/{app_name}/copy-from-branch. Refused 409 when the destination changed since
 * the preview (its stamp differs from `expectedUpdatedAt`). Keys are narrowed by `keys`, each of
 * which must be set on the source (422 otherwise). Audited as `env_vars_copied`, key names only.
 */
export async function copyFromBranch(em: EntityManager, caller: Caller, appName: string, input: CopyInput): Promise<CopyResult> {
  const onConflict = (input.onConflict || "skip") as OnConflict;
  if (!ON_CONFLICT.includes(onConflict)) throw PlatformError.invalid("on_conflict must be one of skip, overwrite.");
  const narrowed = input.keys && input.keys.length > 0 ? [...new Set(input.keys.map(checkKey))] : null;
  const expected = parseExpected(input.expectedUpdatedAt);
  const { destination, source } = await copyBranches(em, caller, appName, input.branch, input.sourceBranch);

  await lockVariables(em, destination);
  const into = await loadVariables(em, destination);
  const current = stampOf(into);
  if ((current?.getTime() ?? null) !== expected) {
    throw PlatformError.conflict({
      code: "destination_changed",
      message: `The variables of branch '${destination.branch}' changed since the preview; preview the copy again.`,
      destination_updated_at: current ? current.toISOString() : null,
    });
  }
  const from = await loadVariables(em, source);
  if (narrowed) {
    const missing = narrowed.filter((k) => !from.rows.has(k));
    if (missing.length > 0) {
      throw PlatformError.invalid({
        code: "keys_not_in_source",
        message: `Branch '${source.branch}' has no variable ${missing.map(quoted).join(", ")}.`,
        keys: missing,
      });
    }
  }
  const keys = (narrowed ?? [...from.rows.keys()]).sort(byName);

  const result: CopyResult = {
    appName: destination.appName,
    branch: destination.branch,
    sourceBranch: source.branch,
    copied: [],
    overwritten: [],
    skipped: [],
    destinationUpdatedAt: current,
  };
  for (const key of keys) {
    const existing = into.rows.get(key);
    if (!existing) result.copied.push(key);
    else if (existing.value !== from.rows.get(key)!.value && onConflict === "overwrite") result.overwritten.push(key);
    else result.skipped.push(key);
  }
  const writes = [...result.copied, ...result.overwritten];
  if (writes.length > 0) {
    checkBranchAfter(into.rows, writes.map((key) => [key, from.rows.get(key)!.value] as const), destination.branch);
    const at = restamp(em, destination, into, actorOf(caller));
    for (const key of writes) setVariable(em, destination, into, key, from.rows.get(key)!.value, at);
    result.destinationUpdatedAt = at;
  }
  audit(em, {
    actor: actorOf(caller),
    action: "env_vars_copied",
    target: destination.id,
    groupSlug: destination.groupSlug,
    details: {
      app_name: destination.appName,
      branch: destination.branch,
      source_branch: source.branch,
      on_conflict: onConflict,
      copied: result.copied,
      overwritten: result.overwritten,
      skipped: result.skipped,
    },
  });
  return result;
}

/**
 * The `copy_vars_from_branch` rule of registration (doc 1 section 4.4): copies the variables of
 * `sourceBranch`, another branch of the same app in the same group, into the newly registered
 * `newApp`; existing keys are never overwritten. Call it in the registration's transaction,
 * after the new row is created. Refusals: 422 `no_other_branch` when the app has no other
 * branch; 409 `destination_is_production` when the new branch is (or would become) production;
 * 404 when the source is not a branch of this app in the group. Returns the copied key names
 * (the response's `copied_var_keys`), sorted. Audited as `env_vars_copied`, key names only.
 */
export async function copyVarsForRegistration(em: EntityManager, newApp: App, sourceBranch: string): Promise<string[]> {
  const others = await em.find(App, { appName: newApp.appName, groupSlug: newApp.groupSlug, id: { $ne: newApp.id } });
  if (others.length === 0) {
    throw PlatformError.invalid({
      code: "no_other_branch",
      message: `App '${newApp.appName}' has no other branch to copy variables from.`,
    });
  }
  if (newApp.isProduction) {
    throw PlatformError.conflict({
      code: "destination_is_production",
      message: `Branch '${newApp.branch}' is or would become the production branch of '${newApp.appName}': production can be copied from, never into.`,
    });
  }
  const source = others.find((a) => a.branch === sourceBranch);
  if (!source) throw appNotFound(newApp.appName, sourceBranch);

  await lockVariables(em, newApp);
  const into = await loadVariables(em, newApp);
  const from = await loadVariables(em, source);
  const copied = [...from.rows.keys()].filter((k) => !into.rows.has(k)).sort(byName);
  if (copied.length > 0) {
    checkBranchAfter(into.rows, copied.map((key) => [key, from.rows.get(key)!.value] as const), newApp.branch);
    const at = restamp(em, newApp, into, newApp.createdBy);
    for (const key of copied) setVariable(em, newApp, into, key, from.rows.get(key)!.value, at);
  }
  audit(em, {
    actor: newApp.createdBy,
    action: "env_vars_copied",
    target: newApp.id,
    groupSlug: newApp.groupSlug,
    details: {
      app_name: newApp.appName,
      branch: newApp.branch,
      source_branch: source.branch,
      on_conflict: "skip",
      copied,
      overwritten: [],
      skipped: [...from.rows.keys()].filter((k) => into.rows.has(k) && !copied.includes(k)).sort(byName),
      via: "registration",
    },
  });
  return copied;
}
