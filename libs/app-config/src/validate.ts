/**
 * The one schema of platform.yaml (ARCHITECTURE section 6). `validateAppConfig` returns every
 * problem it finds, each with its code and path; an empty list means the value is an `AppConfig`.
 *
 * Decisions beyond the example in ARCHITECTURE section 6:
 * - Names (services, drives, buckets, cron jobs) are DNS-label-like: 1-40 lowercase letters,
 *   digits or hyphens, starting with a letter and not ending with a hyphen.
 * - A `container` app (the default) declares at least one service; every service needs `run`; a
 *   service that is not `background: true` serves HTTP and needs `port`; a background service
 *   has no `port`, `health` or `mount`.
 * - A `static` app has no process: `static` is required, `services` is optional and holds at most
 *   one build-only service (only `build`; `run`, `port`, `health`, `replicas`, `memory_mb`,
 *   `mount`, `background` are refused), and it cannot declare drives, cron jobs, or enable
 *   database, cache or email. `static` on a container app is refused.
 * - Service mounts are URL paths (`/` or `/seg/seg`, no trailing slash); no two services share one,
 *   so at most one service is mounted at `/`. `health` and cron `path` are HTTP paths starting
 *   with `/` (a query string is allowed). Drive mounts are absolute filesystem paths, not `/` and
 *   not under /proc, /sys or /dev; drive names and drive mounts are unique; bucket names and
 *   cron job names are unique.
 * - `database`, `cache`, `email` are `{ enabled: boolean }` with `enabled` required.
 * - `static.dir` is a relative path inside the repository (no leading `/`, no `..`);
 *   `static.index_document` is a file name.
 * - Commands (`build`, `run`) are non-empty strings of at most 4096 characters.
 * - Unknown keys are refused at every level, with a "did you mean" hint for near misses.
 * - When `type` itself is invalid, the rules that depend on it are skipped; the rest still apply.
 */
import { checkCronSchedule } from "./cron.ts";
import { formatConfigPath, type PathSegment } from "./path.ts";
import { LIMITS, type AppConfig, type AppType, type ConfigProblem, type ConfigProblemCode } from "./types.ts";

type Mapping = Record<string, unknown>;

/** Service, drive, bucket and cron job names. */
export const NAME_PATTERN = /^[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?$/;
const NAME_RULE = "1-40 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen";

const URL_MOUNT = /^\/$|^(?:\/[A-Za-z0-9._~-]+)+$/;
const HTTP_PATH = /^\/[A-Za-z0-9\-._~!$&'()*+,;=:@%/?]*$/;
const FS_PATH = /^(?:\/[A-Za-z0-9._-]+)+$/;
const REL_DIR = /^[A-Za-z0-9._-]+(?:\/[A-Za-z0-9._-]+)*$/;
const FILE_NAME = /^[A-Za-z0-9._-]+$/;
const RESERVED_DRIVE_ROOTS = ["/proc", "/sys", "/dev"];

const TOP_KEYS = ["type", "services", "database", "cache", "email", "storage", "cron", "static"];
const SERVICE_KEYS = ["build", "run", "port", "health", "replicas", "memory_mb", "mount", "background"];
const STATIC_SERVICE_KEYS = ["build"];
const TOGGLE_KEYS = ["enabled"];
const STORAGE_KEYS = ["drives", "buckets"];
const DRIVE_KEYS = ["name", "size_gb", "mount"];
const BUCKET_KEYS = ["name"];
const CRON_KEYS = ["name", "schedule", "path", "enabled"];
const STATIC_KEYS = ["dir", "spa_fallback", "index_document"];

export function isMapping(value: unknown): value is Mapping {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "a list";
  if (typeof value === "object") return "a mapping";
  if (typeof value === "string") return "a string";
  if (typeof value === "number") return Number.isInteger(value) ? "an integer" : "a number";
  return `a ${typeof value}`;
}

function editDistance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i += 1) {
    let diagonal = row[0] as number;
    row[0] = i;
    for (let j = 1; j <= b.length; j += 1) {
      const above = row[j] as number;
      row[j] = Math.min(above + 1, (row[j - 1] as number) + 1, diagonal + (a[i - 1] === b[j - 1] ? 0 : 1));
      diagonal = above;
    }
  }
  return row[b.length] as number;
}

function suggestion(key: string, allowed: readonly string[]): string {
  let best: string | null = null;
  let bestDistance = 3;
  for (const candidate of allowed) {
    const d = editDistance(key.toLowerCase(), candidate);
    if (d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  return best !== null && bestDistance < Math.max(key.length, 2) ? ` (did you mean "${best}"?)` : "";
}

class Checker {
  readonly problems: ConfigProblem[] = [];

  add(code: ConfigProblemCode, path: readonly PathSegment[], message: string): void {
    this.problems.push(path.length > 0 ? { code, message, path: formatConfigPath(path) } : { code, message });
  }

  /** `unknown_key` for every key of `obj` not in `allowed`. */
  keys(obj: Mapping, allowed: readonly string[], path: readonly PathSegment[]): void {
    for (const key of Object.keys(obj)) {
      if (allowed.includes(key)) continue;
      const where = path.length > 0 ? `in ${formatConfigPath(path)}` : "at the top level";
      this.add(
        "unknown_key",
        [...path, key],
        `Unknown key "${key}" ${where}${suggestion(key, allowed)}; allowed keys are ${allowed.join(", ")}.`,
      );
    }
  }

  /** A mapping at `path`, else `wrong_type` and null. */
  mapping(value: unknown, path: readonly PathSegment[], what = "a mapping"): Mapping | null {
    if (isMapping(value)) return value;
    this.add("wrong_type", path, `${formatConfigPath(path)} must be ${what}, not ${describe(value)}.`);
    return null;
  }

  list(value: unknown, path: readonly PathSegment[]): unknown[] | null {
    if (Array.isArray(value)) return value;
    this.add("wrong_type", path, `${formatConfigPath(path)} must be a list, not ${describe(value)}.`);
    return null;
  }

  required(obj: Mapping, key: string, path: readonly PathSegment[], why = ""): boolean {
    if (obj[key] !== undefined) return true;
    this.add("required", [...path, key], `${formatConfigPath([...path, key])} is required${why}.`);
    return false;
  }

  string(value: unknown, path: readonly PathSegment[], min: number, max: number): value is string {
    const at = formatConfigPath(path);
    if (typeof value !== "string") {
      this.add("wrong_type", path, `${at} must be a string, not ${describe(value)}.`);
      return false;
    }
    if (value.trim().length < min) {
      this.add("out_of_range", path, `${at} must not be empty.`);
      return false;
    }
    if (value.length > max) {
      this.add("out_of_range", path, `${at} must be at most ${max} characters long.`);
      return false;
    }
    return true;
  }

  integer(value: unknown, path: readonly PathSegment[], range: { min: number; max: number }): boolean {
    const at = formatConfigPath(path);
    if (typeof value !== "number" || !Number.isInteger(value)) {
      this.add("wrong_type", path, `${at} must be an integer from ${range.min} to ${range.max}, not ${describe(value)}.`);
      return false;
    }
    if (value < range.min || value > range.max) {
      this.add("out_of_range", path, `${at} must be from ${range.min} to ${range.max}, not ${value}.`);
      return false;
    }
    return true;
  }

  boolean(value: unknown, path: readonly PathSegment[]): boolean {
    if (typeof value === "boolean") return true;
    this.add("wrong_type", path, `${formatConfigPath(path)} must be true or false, not ${describe(value)}.`);
    return false;
  }

  name(value: unknown, path: readonly PathSegment[]): value is string {
    if (!this.string(value, path, 1, Number.MAX_SAFE_INTEGER)) return false;
    if (NAME_PATTERN.test(value)) return true;
    this.add("invalid_format", path, `${formatConfigPath(path)} "${value}" must be ${NAME_RULE}.`);
    return false;
  }

  /** A string matching `pattern` (after the string checks), else `invalid_format` with `rule`. */
  format(value: unknown, path: readonly PathSegment[], pattern: RegExp, rule: string, max: number = LIMITS.pathLength.max): value is string {
    if (!this.string(value, path, 1, max)) return false;
    if (pattern.test(value)) return true;
    this.add("invalid_format", path, `${formatConfigPath(path)} "${value}" must be ${rule}.`);
    return false;
  }
}

function hasDotSegment(path: string): boolean {
  return path.split("/").some((segment) => segment === "." || segment === "..");
}

function checkServices(c: Checker, value: unknown, appType: AppType | null): void {
  const path = ["services"];
  if (value === undefined) {
    if (appType === "container") c.add("required", path, "services is required: a container app declares at least one service.");
    return;
  }
  const services = c.mapping(value, path, "a mapping of service names to services");
  if (!services) return;
  const names = Object.keys(services);
  if (appType === "container" && names.length === 0) {
    c.add("required", path, "services must declare at least one service in a container app.");
  }
  const mounts = new Map<string, string>();
  names.forEach((name, position) => {
    const at = ["services", name];
    if (!NAME_PATTERN.test(name)) {
      c.add("invalid_format", at, `The service name "${name}" must be ${NAME_RULE}.`);
    }
    if (appType === "static" && position > 0) {
      c.add("not_allowed", at, `A static app has at most one (build-only) service; "${names[0]}" is already declared.`);
    }
    const service = c.mapping(services[name], at);
    if (!service) return;

    if (appType === "static") {
      c.keys(service, SERVICE_KEYS, at);
      for (const key of SERVICE_KEYS) {
        if (!STATIC_SERVICE_KEYS.includes(key) && service[key] !== undefined) {
          c.add("not_allowed", [...at, key], `${formatConfigPath([...at, key])} is not allowed: a static app's service is build-only (only "build").`);
        }
      }
      if (service.build !== undefined) c.string(service.build, [...at, "build"], 1, LIMITS.commandLength.max);
      return;
    }

    c.keys(service, SERVICE_KEYS, at);
    if (service.build !== undefined) c.string(service.build, [...at, "build"], 1, LIMITS.commandLength.max);
    if (service.run !== undefined) c.string(service.run, [...at, "run"], 1, LIMITS.commandLength.max);
    else if (appType === "container") c.required(service, "run", at, ": the process to start");

    let background = false;
    if (service.background !== undefined && c.boolean(service.background, [...at, "background"])) {
      background = service.background === true;
    }
    const refuseOnBackground = (key: string): boolean => {
      if (!background || service[key] === undefined) return false;
      c.add("not_allowed", [...at, key], `${formatConfigPath([...at, key])} is not allowed on a background service (no HTTP port, never checked, unrouted).`);
      return true;
    };

    if (!refuseOnBackground("port")) {
      if (service.port !== undefined) c.integer(service.port, [...at, "port"], LIMITS.port);
      else if (!background && appType === "container") {
        c.required(service, "port", at, ": a service that is not background serves HTTP on a port");
      }
    }
    if (!refuseOnBackground("health") && service.health !== undefined) {
      c.format(service.health, [...at, "health"], HTTP_PATH, "an HTTP path starting with /");
    }
    if (service.replicas !== undefined) c.integer(service.replicas, [...at, "replicas"], LIMITS.replicas);
    if (service.memory_mb !== undefined) c.integer(service.memory_mb, [...at, "memory_mb"], LIMITS.memory_mb);
    if (!refuseOnBackground("mount") && service.mount !== undefined) {
      const mountPath = [...at, "mount"];
      if (c.format(service.mount, mountPath, URL_MOUNT, "a URL path: / or /segment[/segment...] without a trailing slash")) {
        const mount = service.mount;
        const owner = mounts.get(mount);
        if (hasDotSegment(mount)) {
          c.add("invalid_format", mountPath, `${formatConfigPath(mountPath)} must not contain . or .. segments.`);
        } else if (owner === undefined) mounts.set(mount, name);
        else if (mount === "/") {
          c.add("duplicate", mountPath, `At most one service can be mounted at /; "${owner}" already is.`);
        } else {
          c.add("duplicate", mountPath, `Two services cannot share the mount ${mount}; "${owner}" already uses it.`);
        }
      }
    }
  });
}

function checkToggle(c: Checker, root: Mapping, key: "database" | "cache" | "email", appType: AppType | null): void {
  if (root[key] === undefined) return;
  const toggle = c.mapping(root[key], [key], "a mapping { enabled: true | false }");
  if (!toggle) return;
  c.keys(toggle, TOGGLE_KEYS, [key]);
  if (!c.required(toggle, "enabled", [key])) return;
  if (!c.boolean(toggle.enabled, [key, "enabled"])) return;
  if (appType === "static" && toggle.enabled === true) {
    c.add("not_allowed", [key, "enabled"], `${key}.enabled cannot be true in a static app: nothing runs that could use it.`);
  }
}

/** Names unique within one list: `duplicate` at the later entry. */
function uniqueNames(c: Checker, items: unknown[], path: readonly PathSegment[], what: string): void {
  const seen = new Map<string, number>();
  items.forEach((item, index) => {
    if (!isMapping(item) || typeof item.name !== "string" || !NAME_PATTERN.test(item.name)) return;
    const first = seen.get(item.name);
    if (first === undefined) seen.set(item.name, index);
    else {
      c.add("duplicate", [...path, index, "name"], `The ${what} name "${item.name}" is already used by ${formatConfigPath([...path, first])}.`);
    }
  });
}

function checkStorage(c: Checker, value: unknown, appType: AppType | null): void {
  if (value === undefined) return;
  const storage = c.mapping(value, ["storage"], "a mapping with drives and buckets");
  if (!storage) return;
  c.keys(storage, STORAGE_KEYS, ["storage"]);

  if (storage.drives !== undefined) {
    const path = ["storage", "drives"];
    const drives = c.list(storage.drives, path);
    if (drives && appType === "static" && drives.length > 0) {
      c.add("not_allowed", path, "storage.drives is not allowed in a static app: there is no container to mount a drive in.");
    } else if (drives) {
      const mounts = new Map<string, number>();
      drives.forEach((item, index) => {
        const at = [...path, index];
        const drive = c.mapping(item, at, "a mapping { name, size_gb, mount }");
        if (!drive) return;
        c.keys(drive, DRIVE_KEYS, at);
        if (c.required(drive, "name", at)) c.name(drive.name, [...at, "name"]);
        if (c.required(drive, "size_gb", at)) c.integer(drive.size_gb, [...at, "size_gb"], LIMITS.size_gb);
        if (c.required(drive, "mount", at)) {
          const mountPath = [...at, "mount"];
          if (c.format(drive.mount, mountPath, FS_PATH, "an absolute path such as /data/uploads, without a trailing slash")) {
            const mount = drive.mount;
            if (hasDotSegment(mount)) {
              c.add("invalid_format", mountPath, `${formatConfigPath(mountPath)} must not contain . or .. segments.`);
            } else if (RESERVED_DRIVE_ROOTS.some((root) => mount === root || mount.startsWith(`${root}/`))) {
              c.add("not_allowed", mountPath, `${formatConfigPath(mountPath)} cannot be under ${RESERVED_DRIVE_ROOTS.join(", ")}.`);
            } else {
              const first = mounts.get(mount);
              if (first === undefined) mounts.set(mount, index);
              else c.add("duplicate", mountPath, `Two drives cannot share the mount ${mount}; ${formatConfigPath([...path, first])} already uses it.`);
            }
          }
        }
      });
      uniqueNames(c, drives, path, "drive");
    }
  }

  if (storage.buckets !== undefined) {
    const path = ["storage", "buckets"];
    const buckets = c.list(storage.buckets, path);
    if (buckets) {
      buckets.forEach((item, index) => {
        const at = [...path, index];
        const bucket = c.mapping(item, at, "a mapping { name }");
        if (!bucket) return;
        c.keys(bucket, BUCKET_KEYS, at);
        if (c.required(bucket, "name", at)) c.name(bucket.name, [...at, "name"]);
      });
      uniqueNames(c, buckets, path, "bucket");
    }
  }
}

function checkCron(c: Checker, value: unknown, appType: AppType | null): void {
  if (value === undefined) return;
  const path = ["cron"];
  const jobs = c.list(value, path);
  if (!jobs) return;
  if (appType === "static" && jobs.length > 0) {
    c.add("not_allowed", path, "cron is not allowed in a static app: there is no process to call.");
    return;
  }
  jobs.forEach((item, index) => {
    const at = [...path, index];
    const job = c.mapping(item, at, "a mapping { name, schedule, path, enabled }");
    if (!job) return;
    c.keys(job, CRON_KEYS, at);
    if (c.required(job, "name", at)) c.name(job.name, [...at, "name"]);
    if (c.required(job, "schedule", at) && c.string(job.schedule, [...at, "schedule"], 1, 256)) {
      const reason = checkCronSchedule(job.schedule);
      if (reason) c.add("invalid_format", [...at, "schedule"], `${formatConfigPath([...at, "schedule"])} "${job.schedule}" is not a valid cron schedule: ${reason}.`);
    }
    if (c.required(job, "path", at)) c.format(job.path, [...at, "path"], HTTP_PATH, "an HTTP path starting with /");
    if (job.enabled !== undefined) c.boolean(job.enabled, [...at, "enabled"]);
  });
  uniqueNames(c, jobs, path, "cron job");
}

function checkStatic(c: Checker, value: unknown, appType: AppType | null): void {
  const path = ["static"];
  if (value === undefined) {
    if (appType === "static") c.add("required", path, "static is required when type is static: { dir, spa_fallback, index_document }.");
    return;
  }
  if (appType === "container") {
    c.add("not_allowed", path, "static is only allowed when type is static.");
    return;
  }
  const site = c.mapping(value, path, "a mapping { dir, spa_fallback, index_document }");
  if (!site) return;
  c.keys(site, STATIC_KEYS, path);
  if (c.required(site, "dir", path)) {
    const dirPath = ["static", "dir"];
    if (c.format(site.dir, dirPath, REL_DIR, "a relative directory inside the repository, such as dist") && site.dir.split("/").includes("..")) {
      c.add("invalid_format", dirPath, `static.dir "${site.dir}" must stay inside the repository (no .. segments).`);
    }
  }
  if (site.spa_fallback !== undefined) c.boolean(site.spa_fallback, ["static", "spa_fallback"]);
  if (site.index_document !== undefined) {
    const docPath = ["static", "index_document"];
    if (c.format(site.index_document, docPath, FILE_NAME, "a file name such as index.html", 255) && /^\.{1,2}$/.test(site.index_document)) {
      c.add("invalid_format", docPath, `static.index_document "${site.index_document}" must be a file name.`);
    }
  }
}

/** Every problem of `value` as a platform.yaml; empty when it is a valid `AppConfig`. */
export function validateAppConfig(value: unknown): ConfigProblem[] {
  if (!isMapping(value)) {
    return [{ code: "not_a_mapping", message: `The config must be a mapping of keys to values, not ${describe(value)}.` }];
  }
  const c = new Checker();
  c.keys(value, TOP_KEYS, []);

  let appType: AppType | null = "container";
  if (value.type !== undefined) {
    if (value.type === "container" || value.type === "static") appType = value.type;
    else {
      appType = null;
      if (typeof value.type === "string") c.add("invalid_value", ["type"], `type must be "container" or "static", not "${value.type}".`);
      else c.add("wrong_type", ["type"], `type must be "container" or "static", not ${describe(value.type)}.`);
    }
  }

  checkServices(c, value.services, appType);
  checkToggle(c, value, "database", appType);
  checkToggle(c, value, "cache", appType);
  checkToggle(c, value, "email", appType);
  checkStorage(c, value.storage, appType);
  checkCron(c, value.cron, appType);
  checkStatic(c, value.static, appType);
  return c.problems;
}

/** `validateAppConfig` that narrows: the value itself as an `AppConfig`, or its problems. */
export function checkAppConfig(value: unknown): { ok: true; config: AppConfig } | { ok: false; errors: ConfigProblem[] } {
  const errors = validateAppConfig(value);
  return errors.length === 0 ? { ok: true, config: value as AppConfig } : { ok: false, errors };
}
