/**
 * The config layers of an app (spec doc 1 section 4.4), as plain functions over plain values:
 *
 * - base: the repository's platform.yaml, refreshed by each successful build (an `AppConfig`, or
 *   null when the repository has none yet);
 * - overlay: a sparse map `{ [path]: { value, base } }` of dashboard edits, where `base` is the
 *   repository's value at that path when the edit was made (null when it had none);
 * - effective: the base with every overlay entry written over it;
 * - source map: for every leaf path of the effective config, `repository` or `dashboard`.
 *
 * Paths (see `formatConfigPath` in @platform/app-config): mapping keys joined with dots, and list
 * elements addressed BY NAME, `cron[nightly].enabled`, `storage.drives[uploads].size_gb`. Every
 * list of the schema holds named entries with unique names, so an overlay entry keeps pointing at
 * the same cron job or drive when the repository reorders or inserts entries; list order is not a
 * layer property (the effective config keeps the repository's order; keys and entries added from
 * the dashboard follow in path order, i.e. by name). An element's `name` leaf is its identity: renaming an element
 * is removing one and adding another. An element without a valid, unique name (only in an invalid
 * config) falls back to its index, `cron[0]`, so every function here is total.
 *
 * A leaf is a scalar or an empty list or mapping. An overlay entry normally holds a leaf; an
 * entry whose value is a whole list or mapping replaces that section of the base (see
 * `overlayWouldDropFields`).
 *
 * Validation problems keep the paths of @platform/app-config (list elements by index, as the
 * submitted document is written).
 */
import {
  checkAppConfig,
  checkConfigBounds,
  checkConfigSize,
  formatConfigPath,
  isPathElementName,
  parseConfigPath,
  parseConfigYaml,
  withPositions,
  type AppConfig,
  type ConfigProblem,
  type PathSegment,
  type TextPosition,
} from "@platform/app-config";

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

export interface OverlayEntry {
  /** The value set from the dashboard. */
  value: JsonValue;
  /** The repository's value at this path when the edit was made, or null when it had none. */
  base: JsonValue | null;
}

/** Dashboard edits by path: `{ "services.web.replicas": { value: 2, base: 1 } }`. */
export type Overlay = Record<string, OverlayEntry>;

export type ConfigSource = "repository" | "dashboard";
export type SourceMap = Record<string, ConfigSource>;

/** The repository layer: a config as authored, or null when the repository has none. */
export type BaseConfig = AppConfig | null | undefined;

// ---------------------------------------------------------------------------------------------
// Plain-value helpers

type Container = JsonObject | JsonValue[];

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function own(obj: JsonObject, key: string): JsonValue | undefined {
  return Object.hasOwn(obj, key) ? obj[key] : undefined;
}

/** Sets an own property even for keys like `__proto__`: never writes to a prototype. */
function define(obj: JsonObject, key: string, value: JsonValue): void {
  Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
}

/** A deep copy made of plain objects and arrays; `undefined` members are dropped. */
function cloneJson(value: unknown): JsonValue {
  if (Array.isArray(value)) return value.map((item) => cloneJson(item));
  if (isObject(value)) {
    const out: JsonObject = {};
    for (const key of Object.keys(value)) {
      if (value[key] !== undefined) define(out, key, cloneJson(value[key]));
    }
    return out;
  }
  return value as JsonValue;
}

function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a)) {
    return Array.isArray(b) && a.length === b.length && a.every((item, i) => deepEqual(item, b[i]));
  }
  if (isObject(a) && isObject(b)) {
    const ak = Object.keys(a).filter((k) => a[k] !== undefined);
    const bk = Object.keys(b).filter((k) => b[k] !== undefined);
    return ak.length === bk.length && ak.every((k) => Object.hasOwn(b, k) && deepEqual(a[k], b[k]));
  }
  return false;
}

/** The key of each list element: its name when valid and unique in the list, else its index. */
function elementKeys(list: readonly JsonValue[]): PathSegment[] {
  const counts = new Map<string, number>();
  for (const item of list) {
    const name = isObject(item) ? own(item, "name") : undefined;
    if (typeof name === "string") counts.set(name, (counts.get(name) ?? 0) + 1);
  }
  return list.map((item, index) => {
    const name = isObject(item) ? own(item, "name") : undefined;
    return typeof name === "string" && isPathElementName(name) && counts.get(name) === 1 ? { name } : index;
  });
}

function findByName(list: readonly JsonValue[], name: string): number {
  return list.findIndex((item) => isObject(item) && own(item, "name") === name);
}

function child(parent: unknown, segment: PathSegment): JsonValue | undefined {
  if (typeof segment === "string") return isObject(parent) ? own(parent, segment) : undefined;
  if (!Array.isArray(parent)) return undefined;
  if (typeof segment === "number") return parent[segment];
  const index = findByName(parent, segment.name);
  return index < 0 ? undefined : parent[index];
}

/** The value at `segments`, or undefined when absent. */
function getAt(root: unknown, segments: readonly PathSegment[]): JsonValue | undefined {
  let node: unknown = root;
  for (const segment of segments) {
    node = child(node, segment);
    if (node === undefined) return undefined;
  }
  return node as JsonValue | undefined;
}

/** Writes `value` at `segments` under `root`, creating or replacing containers on the way. */
function setAt(root: Container, segments: readonly PathSegment[], value: JsonValue): void {
  let parent: Container = root;
  segments.forEach((segment, i) => {
    const next = segments[i + 1];
    const last = next === undefined;
    let current: JsonValue | undefined = child(parent, segment);
    if (!last) {
      const wantList = typeof next !== "string";
      if (wantList ? !Array.isArray(current) : !isObject(current)) current = wantList ? [] : {};
    }
    const written = last ? value : (current as JsonValue);
    if (typeof segment === "string") {
      if (!isObject(parent)) throw new Error("path does not fit the value");
      define(parent, segment, written);
    } else {
      if (!Array.isArray(parent)) throw new Error("path does not fit the value");
      let index = typeof segment === "number" ? segment : findByName(parent, segment.name);
      if (index < 0) {
        index = parent.length;
        // A new named element starts with its name, so it is findable by the next segment.
        if (!last && isObject(written) && own(written, "name") === undefined) define(written, "name", (segment as { name: string }).name);
      }
      while (parent.length < index) parent.push(null);
      parent[index] = written;
    }
    if (!last) parent = written as Container;
  });
}

interface Leaf {
  segments: PathSegment[];
  path: string;
  value: JsonValue;
}

/** Every leaf (scalar, empty list, empty mapping) under `value`, keyed as described above. */
function leaves(value: unknown, prefix: PathSegment[] = [], out: Leaf[] = []): Leaf[] {
  if (Array.isArray(value) || isObject(value)) {
    const entries: Array<[PathSegment, unknown]> = Array.isArray(value)
      ? ((keys) => value.map((item, i): [PathSegment, unknown] => [keys[i] as PathSegment, item]))(elementKeys(value))
      : Object.keys(value)
          .filter((key) => value[key] !== undefined)
          .map((key): [PathSegment, unknown] => [key, value[key]]);
    if (entries.length === 0) {
      if (prefix.length > 0) out.push({ segments: prefix, path: formatConfigPath(prefix), value: cloneJson(value) });
      return out;
    }
    for (const [segment, item] of entries) leaves(item, [...prefix, segment], out);
    return out;
  }
  if (prefix.length > 0 && value !== undefined) out.push({ segments: prefix, path: formatConfigPath(prefix), value: value as JsonValue });
  return out;
}

/** Whether `path` is `ancestor` or lies under it (both canonical). */
function within(path: string, ancestor: string): boolean {
  return path === ancestor || path.startsWith(`${ancestor}.`) || path.startsWith(`${ancestor}[`);
}

/**
 * `segments` written the way `leaves(root)` keys them: a list index becomes the element's name
 * where the list keys that element by name, and a name becomes an index where it keys by index.
 */
function canonicalPath(root: unknown, segments: readonly PathSegment[]): string {
  const out: PathSegment[] = [];
  let node: unknown = root;
  for (const segment of segments) {
    if (typeof segment !== "string" && Array.isArray(node)) {
      const index = typeof segment === "number" ? segment : findByName(node, segment.name);
      const key = index >= 0 && index < node.length ? elementKeys(node)[index] : undefined;
      out.push(key ?? segment);
      node = index >= 0 ? node[index] : undefined;
    } else {
      out.push(segment);
      node = child(node, segment);
    }
  }
  return formatConfigPath(out);
}

interface ParsedEntry {
  path: string;
  segments: PathSegment[];
  entry: OverlayEntry;
}

/** Overlay entries with a usable path (it starts with a key), shortest first, then by path. */
function parsedEntries(overlay: Overlay): ParsedEntry[] {
  const out: ParsedEntry[] = [];
  for (const path of Object.keys(overlay ?? {})) {
    const entry = overlay[path];
    const segments = parseConfigPath(path);
    if (!segments || typeof segments[0] !== "string" || !isObject(entry) || !Object.hasOwn(entry, "value")) continue;
    // A `name` leaf that disagrees with its element's name would rename the element: not an edit.
    const parent = segments[segments.length - 2];
    if (segments[segments.length - 1] === "name" && typeof parent === "object" && entry.value !== parent.name) continue;
    out.push({ path: formatConfigPath(segments), segments, entry });
  }
  return out.sort((a, b) => a.segments.length - b.segments.length || (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

// ---------------------------------------------------------------------------------------------
// Layers

/**
 * The service an entry edits (`services.<name>...`), when it is one of a service the base does
 * not declare and the overlay does not declare either (neither the whole service nor its `run`):
 * a scale of a service the repository has since removed, or a rollback to a build that predates
 * it. Such an entry is an orphan: written over this base it would make a service of one field.
 */
function orphanedService(base: BaseConfig, entries: ParsedEntry[], segments: readonly PathSegment[]): boolean {
  const [section, name] = segments;
  if (section !== "services" || typeof name !== "string" || segments.length < 3) return false;
  if (getAt(base, ["services", name]) !== undefined) return false;
  const declares = (e: ParsedEntry) =>
    e.segments[0] === "services" && e.segments[1] === name && (e.segments.length === 2 || (e.segments.length === 3 && e.segments[2] === "run"));
  return !entries.some(declares);
}

/**
 * The base with every overlay entry written over it (a new object; the inputs are not modified),
 * but the entries of services neither layer declares (see orphanedService): they stay in the
 * overlay, and apply again to a base that declares their service.
 */
export function effectiveConfig(base: BaseConfig, overlay: Overlay): JsonObject {
  const out = isObject(base) ? (cloneJson(base) as JsonObject) : {};
  const entries = parsedEntries(overlay);
  for (const { segments, entry } of entries) {
    if (!orphanedService(base, entries, segments)) setAt(out, segments, cloneJson(entry.value));
  }
  return out;
}

/**
 * For every leaf path of the effective config: `dashboard` when an overlay entry sets it (or a
 * section containing it), else `repository`.
 */
export function sourceMap(base: BaseConfig, overlay: Overlay): SourceMap {
  const effective = effectiveConfig(base, overlay);
  const edited = parsedEntries(overlay).map(({ segments }) => canonicalPath(effective, segments));
  const out: SourceMap = {};
  for (const leaf of leaves(effective)) {
    out[leaf.path] = edited.some((path) => within(leaf.path, path)) ? "dashboard" : "repository";
  }
  return out;
}

/**
 * The repository's leaf paths that the effective config no longer has because an overlay entry
 * replaces a whole section (a mapping or list value, or a scalar written over a section). Sorted;
 * empty for an overlay of leaf edits. The scale route refuses with `overlay_would_drop_fields`
 * and these as `removed_paths` when the overlay it would write gives a non-empty list.
 */
export function overlayWouldDropFields(base: BaseConfig, overlay: Overlay): string[] {
  const effective = effectiveConfig(base, overlay);
  return leaves(base)
    .filter((leaf) => getAt(effective, leaf.segments) === undefined)
    .map((leaf) => leaf.path)
    .sort();
}

/**
 * The overlay paths whose recorded `base` is no longer the repository's value there: the
 * repository changed the field after the dashboard edit (the edit still wins). Sorted.
 */
export function staleOverlayPaths(base: BaseConfig, overlay: Overlay): string[] {
  return parsedEntries(overlay)
    .filter(({ segments, entry }) => !deepEqual(entry.base ?? null, getAt(base, segments) ?? null))
    .map(({ path }) => path)
    .sort();
}

/**
 * The overlay with one dashboard edit applied (the scale route: `services.web.replicas`; the cron
 * toggle: `cron[nightly].enabled`). The entry records the repository's current value as `base`.
 * Setting the repository's own value removes the entry (the field returns to `repository`). When
 * an ancestor entry already replaces the section, the edit is made inside that entry's value.
 * Entries under `path` are superseded and removed. Throws on a path that is not a config path.
 */
export function setOverlayEntry(base: BaseConfig, overlay: Overlay, path: string, value: JsonValue): Overlay {
  const segments = parseConfigPath(path);
  if (!segments || typeof segments[0] !== "string") throw new Error(`not a config path: ${path}`);
  const target = formatConfigPath(segments);
  const entries = parsedEntries(overlay);

  const ancestor = entries.find((e) => e.path !== target && within(target, e.path) && (Array.isArray(e.entry.value) || isObject(e.entry.value)));
  if (ancestor) {
    const inner = cloneJson(ancestor.entry.value) as Container;
    setAt(inner, segments.slice(ancestor.segments.length), cloneJson(value));
    return { ...copyOverlay(overlay), [ancestor.path]: { value: inner, base: ancestor.entry.base } };
  }

  const out: Overlay = {};
  for (const e of entries) {
    if (!within(e.path, target)) out[e.path] = e.entry;
  }
  const repositoryValue = getAt(base, segments);
  if (!deepEqual(value, repositoryValue)) {
    out[target] = { value: cloneJson(value), base: repositoryValue === undefined ? null : cloneJson(repositoryValue) };
  }
  return out;
}

function copyOverlay(overlay: Overlay): Overlay {
  const out: Overlay = {};
  for (const e of parsedEntries(overlay)) out[e.path] = e.entry;
  return out;
}

/** Whether `value` has the shape of an overlay (as read back from storage). */
export function isOverlay(value: unknown): value is Overlay {
  if (!isObject(value)) return false;
  return Object.keys(value).every((path) => {
    const segments = parseConfigPath(path);
    const entry = value[path];
    return (
      segments !== null &&
      typeof segments[0] === "string" &&
      isObject(entry) &&
      Object.hasOwn(entry, "value") &&
      Object.hasOwn(entry, "base") &&
      Object.keys(entry).length === 2
    );
  });
}

// ---------------------------------------------------------------------------------------------
// Save config

export type SaveConfigBodyResult =
  | {
      ok: true;
      submitted: Record<string, unknown>;
      /** Present for `config_yaml`: where a path of the submitted document is written. */
      locate?: (path: string) => TextPosition | undefined;
    }
  | { ok: false; errors: ConfigProblem[] };

/**
 * The save body `{config}` or `{config_yaml}` to the submitted config. A field that is null counts
 * as absent. Refusals (all 422): `invalid_body` (not a JSON object), `unknown_field`, `both_config_fields`,
 * `missing_config`, `config_yaml_not_string`, then the parser's (`yaml_syntax` with line and
 * column, `yaml_unsupported`, `not_a_mapping`, `too_large`, `too_deep`, `too_many_nodes`), or for
 * `config` the bounds and `not_a_mapping`.
 */
export function readSaveConfigBody(body: unknown): SaveConfigBodyResult {
  if (!isObject(body)) {
    return { ok: false, errors: [{ code: "invalid_body", message: "The body must be a JSON object with config or config_yaml." }] };
  }
  // A misplaced field (`branch` belongs in the query) must not save to the production branch unnoticed.
  const unknown = Object.keys(body).filter((field) => field !== "config" && field !== "config_yaml");
  if (unknown.length > 0) {
    return {
      ok: false,
      errors: unknown.map((field) => ({ code: "unknown_field", message: `${field} is not a field of a config save (send config or config_yaml; the branch goes in ?branch=).` })),
    };
  }
  const config = own(body, "config");
  const yaml = own(body, "config_yaml");
  const hasConfig = config !== undefined && config !== null;
  const hasYaml = yaml !== undefined && yaml !== null;
  if (hasConfig && hasYaml) {
    return { ok: false, errors: [{ code: "both_config_fields", message: "Send exactly one of config and config_yaml, not both." }] };
  }
  if (!hasConfig && !hasYaml) {
    return { ok: false, errors: [{ code: "missing_config", message: "Send exactly one of config (an object) and config_yaml (a string)." }] };
  }
  if (hasYaml) {
    if (typeof yaml !== "string") {
      return { ok: false, errors: [{ code: "config_yaml_not_string", message: "config_yaml must be a string." }] };
    }
    const parsed = parseConfigYaml(yaml);
    return parsed.ok ? { ok: true, submitted: parsed.value, locate: parsed.locate } : parsed;
  }
  const bounds = checkConfigBounds(config);
  if (bounds.length > 0) return { ok: false, errors: bounds };
  if (!isObject(config)) {
    return { ok: false, errors: [{ code: "not_a_mapping", message: "config must be an object of keys to values." }] };
  }
  const size = checkConfigSize(config);
  if (size.length > 0) return { ok: false, errors: size };
  return { ok: true, submitted: config };
}

export type SaveConfigResult =
  | {
      ok: true;
      /** The new overlay: exactly the submitted config's differences from the repository base. */
      overlay: Overlay;
      /** Leaf paths whose effective value changes with this save (added, changed or removed), sorted. */
      changedPaths: string[];
      /** Every change takes effect without a deploy (see `LIVE_SECTIONS`). */
      appliesLive: boolean;
      /** At least one change needs a redeploy to take effect. */
      requiresRedeploy: boolean;
      /** The new effective config, validated. */
      effective: AppConfig;
    }
  | { ok: false; errors: ConfigProblem[] };

/**
 * Top-level sections whose changes apply live. Rule: only `cron` (enabled, schedule, path, added
 * jobs): the platform's scheduler reads the effective config on every tick and calls the app over
 * HTTP, so nothing in the running release changes. Everything else requires a redeploy: services
 * (including `replicas`, which the scale route also applies by redeploying the running image),
 * database, cache and email (environment and provisioning), storage (mounts and credentials),
 * type and static (a new build or static deploy).
 */
export const LIVE_SECTIONS: readonly string[] = ["cron"];

/** Paths (by name where possible) whose value differs between two configs, sorted. */
function changedLeafPaths(before: JsonObject, after: JsonObject): string[] {
  const changed = new Set<string>();
  for (const leaf of leaves(before)) {
    if (!deepEqual(leaf.value, getAt(after, leaf.segments))) changed.add(leaf.path);
  }
  for (const leaf of leaves(after)) {
    if (!deepEqual(leaf.value, getAt(before, leaf.segments))) changed.add(leaf.path);
  }
  return [...changed].sort();
}

/**
 * A problem path of `from` (list elements by index) rewritten for `to`: an element is found in
 * `to` by its name, so problems on the merged config point into the document that was submitted.
 */
function translatePath(path: string, from: unknown, to: unknown): string {
  const segments = parseConfigPath(path);
  if (!segments) return path;
  const out: PathSegment[] = [];
  let a: unknown = from;
  let b: unknown = to;
  for (const segment of segments) {
    if (typeof segment === "number" && Array.isArray(a) && Array.isArray(b)) {
      const element = a[segment];
      const name = isObject(element) ? own(element, "name") : undefined;
      const index = typeof name === "string" ? findByName(b, name) : -1;
      out.push(index >= 0 ? index : segment);
      a = element;
      b = index >= 0 ? b[index] : undefined;
    } else {
      out.push(segment);
      a = child(a, segment);
      b = child(b, segment);
    }
  }
  return formatConfigPath(out);
}

/**
 * The save pipeline of spec doc 1 section 4.4 after the body is read (`readSaveConfigBody`):
 *
 * 1. bound: depth and node count of `submitted` (`too_deep`, `too_many_nodes`, `not_a_mapping`);
 * 2. validate the merged config (the base with the submitted differences written over it) with the
 *    one schema; problem paths are rewritten to point into the submitted document;
 * 3. refuse omissions: every leaf path the repository base defines must be present in the
 *    submission: one `omitted_repository_field` problem per missing path (omission never unsets;
 *    a field added from the dashboard can be dropped by omitting it);
 * 4. diff the submission against the base and keep only the differences as the new overlay (an
 *    entry whose value is unchanged from `currentOverlay` keeps its recorded `base`);
 * 5. report the changed effective paths and whether they apply live or need a redeploy.
 *
 * Every refusal is returned (422-worthy), never thrown. Bumping the preflight nonce and
 * re-queueing preflight are the caller's. `options.locate` (from `readSaveConfigBody` for YAML)
 * adds line and column to problems.
 */
export function saveConfig(
  base: BaseConfig,
  currentOverlay: Overlay,
  submitted: unknown,
  options: { locate?: (path: string) => TextPosition | undefined } = {},
): SaveConfigResult {
  const fail = (errors: ConfigProblem[]): SaveConfigResult => ({
    ok: false,
    errors: options.locate ? withPositions(errors, options.locate) : errors,
  });

  const bounds = checkConfigBounds(submitted);
  if (bounds.length > 0) return fail(bounds);
  if (!isObject(submitted)) {
    return fail([{ code: "not_a_mapping", message: "The config must be a mapping of keys to values." }]);
  }
  const baseValue = isObject(base) ? (cloneJson(base) as JsonObject) : {};

  // The differences, as overlay entries keyed by canonical path.
  const previous = new Map(parsedEntries(currentOverlay).map((e) => [e.path, e.entry]));
  const overlay: Overlay = {};
  for (const leaf of leaves(submitted)) {
    const repositoryValue = getAt(baseValue, leaf.segments);
    if (deepEqual(leaf.value, repositoryValue)) continue;
    const kept = previous.get(leaf.path);
    overlay[leaf.path] =
      kept && deepEqual(kept.value, leaf.value)
        ? kept
        : { value: leaf.value, base: repositoryValue === undefined ? null : cloneJson(repositoryValue) };
  }

  const merged = effectiveConfig(base, overlay);
  const checked = checkAppConfig(merged);
  if (!checked.ok) {
    return fail(checked.errors.map((p) => (p.path === undefined ? p : { ...p, path: translatePath(p.path, merged, submitted) })));
  }

  const omitted = leaves(baseValue).filter((leaf) => getAt(submitted, leaf.segments) === undefined);
  if (omitted.length > 0) {
    return fail(
      omitted.map((leaf) => ({
        code: "omitted_repository_field",
        message: `${leaf.path} is defined in the repository's config and was omitted; omission never unsets a repository field.`,
        path: leaf.path,
      })),
    );
  }

  const changedPaths = changedLeafPaths(effectiveConfig(base, currentOverlay), merged);
  const live = (path: string) => {
    const first = parseConfigPath(path)?.[0];
    return typeof first === "string" && LIVE_SECTIONS.includes(first);
  };
  const requiresRedeploy = changedPaths.some((path) => !live(path));
  return {
    ok: true,
    overlay,
    changedPaths,
    appliesLive: changedPaths.length > 0 && !requiresRedeploy,
    requiresRedeploy,
    effective: checked.config,
  };
}
