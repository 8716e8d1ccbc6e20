/**
 * App names and branch labels (spec doc 1 section 2.1): names are sanitised to lowercase
 * slug-like labels that can appear in hostnames.
 */
import { HOST_LABEL_MAX, sanitizeName } from "@platform/bus";
import { PlatformError } from "@platform/errors";

export const APP_NAME_MAX = 128;

export function appNameFrom(input: string): string {
  const raw = input.trim();
  // Characters as the gateway's schema counts them: code points, not UTF-16 units.
  const length = [...raw].length;
  if (length > APP_NAME_MAX) throw PlatformError.invalid(`app_name must be 1-${APP_NAME_MAX} characters.`);
  const name = sanitizeName(raw);
  // Names become hostname labels: only a-z and 0-9 survive (blanks and `日本` leave nothing).
  if (!name) throw PlatformError.invalid("app_name must contain ASCII letters or digits (a-z, 0-9): it becomes a hostname label.");
  return name;
}

/** The branch as a hostname label: `feature/Login` → `feature-login`. */
export function branchLabel(branch: string): string {
  const label = sanitizeName(branch);
  if (!label) throw PlatformError.invalid("branch must contain ASCII letters or digits (a-z, 0-9): it becomes a hostname label.");
  return label;
}

/** Characters git allows nowhere in a ref name: controls, space, ~ ^ : ? * [ and backslash. */
const BRANCH_CHARACTERS = /^[^\s~^:?*[\\\x00-\x1f\x7f]{1,200}$/;

/** Git's own rules for a branch name, as `git check-ref-format --branch` applies them. */
export function checkBranch(branch: string): string {
  const value = branch.trim();
  const components = value.split("/");
  const valid =
    BRANCH_CHARACTERS.test(value) &&
    !value.startsWith("-") &&
    value !== "@" &&
    !value.includes("..") &&
    !value.includes("@{") &&
    !value.endsWith(".") &&
    components.every((c) => c !== "" && !c.startsWith(".") && !c.endsWith(".lock"));
  if (!valid) throw PlatformError.invalid(`'${branch}' is not a valid git branch name.`);
  return value;
}

/** The label of a valid branch name; undefined for a name `checkBranch` refuses. */
export function validBranchLabel(branch: string): string | undefined {
  try {
    return branchLabel(checkBranch(branch));
  } catch {
    return undefined;
  }
}

/**
 * LIKE patterns matching every name `withSuffix` may try for `base`: a suffix cuts a long base
 * short to stay within a label, so names that start like the shortest cut (room for a suffix of
 * up to seven digits) are candidates too.
 */
export function suffixPatterns(base: string): string[] {
  const stem = base.slice(0, HOST_LABEL_MAX - 8);
  return stem.length < base.length ? [`${base}-%`, `${stem}%`] : [`${base}-%`];
}

/**
 * Words a route of the API reads as its own where an app name could stand
 * (`/api/builds/id/{prefix}` beside `/api/builds/{app_name}/{tag}`, `/api/deployments/history`
 * and `/api/deployments/queue/...` beside `/api/deployments/{app_name}/undeploy`): an app of
 * that name could not be reached there, so they count as taken (`id` registers as `id-2`).
 */
export const RESERVED_APP_NAMES: ReadonlySet<string> = new Set(["id", "history", "queue"]);

/** The next free slug: `shop`, then `shop-2`, `shop-3`... */
export function withSuffix(base: string, taken: ReadonlySet<string>): string {
  if (!taken.has(base) && !RESERVED_APP_NAMES.has(base)) return base;
  for (let n = 2; ; n++) {
    const suffix = `-${n}`;
    const candidate = `${base.slice(0, HOST_LABEL_MAX - suffix.length)}${suffix}`;
    if (!taken.has(candidate)) return candidate;
  }
}

/**
 * A branch other than production is served at `<app>-<branch label>` (front-door.ts): one DNS
 * label, so the two together must fit in 63 characters (spec 4.4, branch candidates'
 * `label_too_long`). The production branch goes by the app name alone, which always fits.
 */
export function checkBranchHostLabel(appName: string, label: string, remedy = "Use a shorter branch name."): void {
  const host = `${appName}-${label}`;
  if (host.length <= HOST_LABEL_MAX) return;
  throw PlatformError.invalid({
    code: "label_too_long",
    message: `Branch label '${label}' makes the host label '${host}' ${host.length} characters long; a host label holds at most ${HOST_LABEL_MAX}. ${remedy}`,
    max: HOST_LABEL_MAX,
  });
}

/**
 * The refusal of a branch whose host label (`<app>-<branch label>`) another app already answers
 * to: two apps cannot share a front door (registration.ts, hostLabelsTaken).
 */
export function hostLabelTaken(appName: string, label: string): PlatformError {
  const host = `${appName}-${label}`;
  return PlatformError.conflict({
    code: "host_label_taken",
    message: `Branch '${label}' of '${appName}' would be served at '${host}', an address another app already answers to. Use another branch name.`,
    host_label: host,
  });
}
