/**
 * The rules of GET /api/logs (spec doc 1 sections 4.6 and 8) as plain functions: reading the
 * parameters (since, ids, limit, offset), the tenant scope, the source semantics, and the SQL
 * that answers them. No I/O here: `log-store.ts` runs what `logSql` builds.
 */
import { appNameKey } from "@platform/bus";
import { PlatformError } from "@platform/errors";
import { spansEveryGroup, type Caller } from "@platform/caller";
import { LOG_LEVELS, LOG_SOURCES, MAX_ID_CHARS, isHexOrHyphenId, type LogLevel, type LogSource } from "@platform/logship";

export const DEFAULT_LIMIT = 100;
export const MAX_LIMIT = 1000;
export const DEFAULT_SINCE = "1h";
/** The widest window `since` may name; a larger one is clamped. */
export const MAX_SINCE_MS = 365 * 24 * 3600 * 1000;
/**
 * Counting stops here (or at offset + limit when that is larger): past it `total` reports the
 * bound plus one, a lower bound, so a broad search never counts a million rows.
 */
export const COUNT_CAP = 10_000;
/** `source=build` without an id reads the lines of this many most recent builds (by their first line). */
export const RECENT_BUILDS = 5;
export const MAX_SEARCH_CHARS = 500;

/** The parameters as they arrive (strings; empty means not given). */
export interface LogQueryInput {
  appName?: string;
  source?: string;
  serviceName?: string;
  deploymentId?: string;
  buildId?: string;
  actionId?: string;
  level?: string;
  search?: string;
  since?: string;
  limit?: number;
  offset?: number;
  branch?: string;
}

/** The parameters once checked: null means no filter. */
export interface LogQuery {
  appName: string | null;
  /** Scopes the access check of app_name; never a filter of its own. */
  branch: string | null;
  source: LogSource | null;
  serviceName: string | null;
  deploymentId: string | null;
  buildId: string | null;
  actionId: string | null;
  level: LogLevel | null;
  search: string | null;
  since: Date;
  limit: number;
  offset: number;
}

const SINCE = /^(\d{1,9})([smhdw])$/;
const UNIT_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/**
 * `since` is relative: a positive whole number and a unit, s m h d or w (`30m`, `1h`, `24h`,
 * `7d`); default 1h. Anything else is a 422. Windows past 365 days are clamped to 365 days.
 */
export function parseSince(value: string | undefined, now: Date): Date {
  const raw = (value ?? "").trim() || DEFAULT_SINCE;
  const match = SINCE.exec(raw);
  const amount = match ? Number(match[1]) : 0;
  if (!match || amount <= 0) {
    throw PlatformError.invalid(`since must be a relative time such as 30m, 1h, 24h or 7d (got '${raw}').`);
  }
  const ms = Math.min(amount * UNIT_MS[match[2]!]!, MAX_SINCE_MS);
  return new Date(now.getTime() - ms);
}

/** A deployment, build or action id: hex digits and hyphens only (422 otherwise); empty: none. */
export function checkLogId(field: string, value: string | undefined): string | null {
  const id = (value ?? "").trim();
  if (!id) return null;
  if (!isHexOrHyphenId(id)) {
    throw PlatformError.invalid(id.length > MAX_ID_CHARS ? `${field} must be at most ${MAX_ID_CHARS} characters.` : `${field} must contain only hex digits and hyphens.`);
  }
  return id.toLowerCase();
}

function oneOf<T extends string>(field: string, value: string | undefined, allowed: readonly T[]): T | null {
  const v = (value ?? "").trim();
  if (!v) return null;
  if (!(allowed as readonly string[]).includes(v)) throw PlatformError.invalid(`${field} must be one of ${allowed.join(", ")}.`);
  return v as T;
}

/** Checks every parameter (422 on the first bad one). Supplying an id drops app_name and branch. */
export function normaliseLogQuery(input: LogQueryInput, now: Date): LogQuery {
  const limit = input.limit ?? DEFAULT_LIMIT;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) throw PlatformError.invalid(`limit must be between 1 and ${MAX_LIMIT}.`);
  const offset = input.offset ?? 0;
  if (!Number.isInteger(offset) || offset < 0) throw PlatformError.invalid("offset must be 0 or more.");
  const search = (input.search ?? "").trim();
  if (search.length > MAX_SEARCH_CHARS) throw PlatformError.invalid(`search must be at most ${MAX_SEARCH_CHARS} characters.`);
  const deploymentId = checkLogId("deployment_id", input.deploymentId);
  const buildId = checkLogId("build_id", input.buildId);
  const actionId = checkLogId("action_id", input.actionId);
  // An id is globally unique and identifies its app: app_name and branch no longer matter.
  const byId = Boolean(deploymentId || buildId || actionId);
  const appName = byId || !input.appName?.trim() ? null : appNameKey(input.appName);
  return {
    appName,
    branch: appName && input.branch?.trim() ? input.branch.trim() : null,
    source: oneOf("source", input.source, LOG_SOURCES),
    serviceName: input.serviceName?.trim() || null,
    deploymentId,
    buildId,
    actionId,
    level: oneOf("level", input.level, LOG_LEVELS),
    search: search || null,
    since: parseSince(input.since, now),
    limit,
    offset,
  };
}

/** Whose lines a caller reads: every group's, one group's, or none. */
export type GroupScope = { kind: "all" } | { kind: "group"; slug: string } | { kind: "none" };

/**
 * The tenancy of logs, the same as the rest of the API: a tenant reads the group it acts in
 * (lines carry their app's group); an operator reads every group, or the group it selected
 * explicitly. Platform lines (no group) are for operators only.
 */
export function groupScope(caller: Caller): GroupScope {
  if (caller.platformOperator) return spansEveryGroup(caller) || !caller.selectedGroup ? { kind: "all" } : { kind: "group", slug: caller.selectedGroup };
  if (caller.selectedGroup && caller.visibleGroups.includes(caller.selectedGroup)) return { kind: "group", slug: caller.selectedGroup };
  return { kind: "none" };
}

/**
 * What separates the words of a message and of a search (a POSIX regular expression): spaces, and
 * punctuation, so that the words inside a path, a URL or a hyphenated name are words too. The
 * stored `message_tsv` is built with it (migration 0005).
 */
export const SEARCH_WORD_SEPARATORS = "[[:punct:]]+";

export interface Sql {
  text: string;
  values: unknown[];
}

/** The columns of a log row (spec doc 1 section 2.6), metadata as JSON text. */
export const ROW_COLUMNS =
  "id, ts, source, level, app_name, service_name, deployment_id, build_id, action_id, instance_id, message, metadata::text as metadata";

/** The bound past which counting stops (see COUNT_CAP). */
export function countBound(q: Pick<LogQuery, "offset" | "limit">): number {
  return Math.max(COUNT_CAP, q.offset + q.limit);
}

/**
 * The page and the count of one query, as parameterised SQL over `log_lines`. Both share one
 * WHERE clause: the window, the scope, the owning app (ids or app_name), the source semantics,
 * then service, level and the full-text search. `branch` filters no line (spec 4.6: it only
 * scopes the access check, which the gateway makes against the app's registered branches).
 */
export function logSql(q: LogQuery, scope: Exclude<GroupScope, { kind: "none" }>): { page: Sql; count: Sql } {
  const values: unknown[] = [];
  const param = (value: unknown) => {
    values.push(value);
    return `$${values.length}`;
  };
  const since = param(q.since);
  const group = scope.kind === "group" ? param(scope.slug) : null;
  const deployment = q.deploymentId ? param(q.deploymentId) : null;
  const build = q.buildId ? param(q.buildId) : null;
  const action = q.actionId ? param(q.actionId) : null;
  const app = q.appName ? param(q.appName) : null;

  // The window, the scope, and the owning app.
  const where = [`ts >= ${since}`];
  if (group) where.push(`group_slug = ${group}`);
  const ids = [
    ["deployment_id", deployment],
    ["build_id", build],
    ["action_id", action],
  ] as const;
  for (const [column, id] of ids) {
    if (!id) continue;
    // A container line carries the deployment that started its replica, but no build or action
    // id: there a build or action id names its app (spec 4.6, "identifies the owning app"),
    // through any line that carries it. Every other line is filtered by the id it carries.
    if (q.source === "container" && column !== "deployment_id") {
      where.push(`app_name = ${owningApp(column, id, group)}`);
    } else {
      where.push(`${column} = ${id}`);
    }
  }
  if (app) where.push(`app_name = ${app}`);
  switch (q.source) {
    case null:
      break;
    case "deploy":
      // Deploy lines, and the agent's lines about a deployment.
      where.push("(source = 'deploy' or (source = 'agent' and deployment_id is not null))");
      break;
    case "build":
      where.push("source = 'build'");
      if (!deployment && !build && !action) {
        // The shipped lines of the most recent builds, newest start first: log_builds is what
        // the build lines told (the builds table belongs to apps-builds). An id names its build.
        const recent = [`rb.last_ts >= ${since}`];
        if (group) recent.push(`rb.group_slug = ${group}`);
        if (app) recent.push(`rb.app_name = ${app}`);
        where.push(`build_id in (select rb.build_id from log_builds rb where ${recent.join(" and ")} order by rb.first_ts desc limit ${RECENT_BUILDS})`);
      }
      break;
    case "container":
      // The collector's stdout and stderr lines of every replica, both stored as source
      // container (metadata.stream tells them apart). The spec merges in the crash tail the
      // agent captured (last 30 lines, kept in the failed deploy action's result), but those
      // lines are the crashed replica's own output, which the collector already shipped as
      // container lines: reading the action's result too would show each of them twice, so
      // the stored container lines alone are the merged result. (The agent also ships the
      // tail as deploy error lines; those belong to source deploy.)
      where.push("source = 'container'");
      break;
    default:
      // agent and backup: exactly that source.
      where.push(`source = ${param(q.source)}`);
  }
  if (q.serviceName) where.push(`service_name = ${param(q.serviceName)}`);
  if (q.level) where.push(`level = ${param(q.level)}`);
  if (q.search) where.push(`message_tsv @@ plainto_tsquery('simple', regexp_replace(${param(q.search)}, '${SEARCH_WORD_SEPARATORS}', ' ', 'g'))`);

  const clause = where.join(" and ");
  const shared = values.length;
  const page = {
    text: `select ${ROW_COLUMNS} from log_lines where ${clause} order by ts desc, id desc limit $${shared + 1} offset $${shared + 2}`,
    values: [...values, q.limit, q.offset],
  };
  const count = {
    text: `select count(*)::int as n from (select 1 from log_lines where ${clause} limit $${shared + 1}) c`,
    values: [...values, countBound(q) + 1],
  };
  return { page, count };
}

/**
 * Why an empty `source=container` answer is empty (spec doc 1 section 4.6): `no_log_group` when
 * nothing was ever deployed for that app, service and branch (no container line was ever
 * stored), `no_output_yet` when there was but nothing matches the window and filters.
 */
export type ContainerReason = "no_log_group" | "no_output_yet";

/**
 * Whether a log group exists for an empty container answer: the app (named, or owning the id
 * given), service and branch when given, within the caller's scope, so another group's app
 * reads like an unknown one. Answers `found`.
 */
export function logGroupSql(q: LogQuery, scope: Exclude<GroupScope, { kind: "none" }>): Sql {
  const values: unknown[] = [];
  const param = (value: unknown) => {
    values.push(value);
    return `$${values.length}`;
  };
  const where: string[] = [];
  const group = scope.kind === "group" ? param(scope.slug) : null;
  if (group) where.push(`g.group_slug = ${group}`);
  if (q.appName) where.push(`g.app_name = ${param(q.appName)}`);
  if (q.branch) where.push(`g.branch = ${param(q.branch)}`);
  if (q.serviceName) where.push(`g.service_name = ${param(q.serviceName)}`);
  // An id names its app through the lines that carry it (container lines carry none).
  const ids = [
    ["deployment_id", q.deploymentId],
    ["build_id", q.buildId],
    ["action_id", q.actionId],
  ] as const;
  for (const [column, id] of ids) {
    if (id) where.push(`g.app_name = ${owningApp(column, param(id), group)}`);
  }
  const clause = where.length > 0 ? ` where ${where.join(" and ")}` : "";
  return { text: `select exists (select 1 from log_groups g${clause}) as found`, values };
}

/** The app an id names (spec 4.6), as SQL: the app of a line that carries it, within the group. */
function owningApp(column: "deployment_id" | "build_id" | "action_id", id: string, group: string | null): string {
  return `(select l.app_name from log_lines l where l.${column} = ${id}${group ? ` and l.group_slug = ${group}` : ""} limit 1)`;
}

/** `total` and `has_more` from the counted rows (see COUNT_CAP). */
export function pageTotals(q: Pick<LogQuery, "offset" | "limit">, counted: number, returned: number): { total: number; hasMore: boolean } {
  const total = Math.min(counted, countBound(q) + 1);
  return { total, hasMore: q.offset + returned < total };
}
