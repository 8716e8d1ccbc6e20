/**
 * The log store: `log_lines` in the service's schema, written in batches and searched with the
 * SQL of `log-query.ts`. It keeps two small pg pools of its own beside MikroORM's, for what the
 * ORM's connection does not give: native bind parameters (a batch is one JSON parameter), and
 * bounded waits (a read gives up after QUERY_TIMEOUT_MS, so GET /api/logs answers with its
 * `error` key well inside the gateway's deadline when Postgres is slow or gone).
 */
import pg from "pg";
import { withClient } from "@platform/db";
import type { Logger } from "@platform/logger";
import type { Caller } from "@platform/caller";
import type { StoredLine } from "./ingest.ts";
import { LOG_PRUNE_BATCH, PRUNE_BUILDS, PRUNE_LINES } from "./retention.ts";
import { FORGETTING_SHARED_LOCK, PRUNE_TOMBSTONES, UNFORGOTTEN_LINES } from "./forgetting.ts";
import { groupScope, logGroupSql, logSql, normaliseLogQuery, pageTotals, type ContainerReason, type LogQueryInput } from "./log-query.ts";

/** Longest a read may take; the gateway's deadline is 5 s. */
export const QUERY_TIMEOUT_MS = 3_500;
const CONNECT_TIMEOUT_MS = 2_000;

export interface LogRowView {
  id: string;
  timestamp: string;
  source: string;
  level: string;
  app_name: string | null;
  service_name: string | null;
  deployment_id: string | null;
  build_id: string | null;
  action_id: string | null;
  instance_id: string | null;
  message: string;
  /** JSON text of the metadata object. */
  metadata: string;
}

export interface LogPage {
  logs: LogRowView[];
  total: number;
  hasMore: boolean;
  /** Set when the store could not answer (the spec's `error` key). */
  error?: string;
  /** Set on an empty `source=container` answer the store gave: why it is empty. */
  reason?: ContainerReason;
}

export interface LogStoreOptions {
  url: string;
  schema: string;
  logger: Logger;
  /** Connections for reads (default 8). */
  readPoolMax?: number;
  queryTimeoutMs?: number;
}

interface DbRow {
  id: string;
  ts: Date;
  source: string;
  level: string;
  app_name: string | null;
  service_name: string | null;
  deployment_id: string | null;
  build_id: string | null;
  action_id: string | null;
  instance_id: string | null;
  message: string;
  metadata: string;
}

/** Data-dependent failures (SQLSTATE classes 22 and 23): the same input fails again. */
export function isDataError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^2[23][0-9A-Z]{3}$/.test(code);
}

/**
 * Why the store could not answer, in words for the API, or null for an error that is not the
 * store's (a bug: it becomes a 500).
 */
export function storeFailure(err: unknown): string | null {
  const e = err as { code?: unknown; message?: unknown } | null;
  const code = typeof e?.code === "string" ? e.code : "";
  const message = typeof e?.message === "string" ? e.message : "";
  if (code === "57014" || /query read timeout/i.test(message)) {
    return "The log query took too long; narrow it with since, app_name or a more specific search.";
  }
  if (
    /^(08|53|57|58)/.test(code) ||
    /^E(CONNREFUSED|CONNRESET|HOSTUNREACH|NETUNREACH|TIMEDOUT|PIPE|NOTFOUND|AI_AGAIN)$/.test(code) ||
    /timeout exceeded when trying to connect|Connection terminated|connect ETIMEDOUT|Client has encountered a connection error/i.test(message)
  ) {
    return "The log store is unreachable; try again shortly.";
  }
  return null;
}

/**
 * The deploy phases from which a service's replicas have been started (agent/src/deployer.ts):
 * a deploy line of one of them says the service's output stream exists, printed to or not.
 */
const STARTED_PHASES = ["start", "health_check", "ready", "swap_committed", "drain"].map((p) => `'${p}'`).join(", ");

/**
 * One statement per batch: the lines, and what they tell the side tables: the builds
 * (log_builds) and the log groups (log_groups) of container lines and of services a deploy
 * started. last_seen moves at most once a minute, so a busy app
 * does not rewrite its rows on every batch.
 */
const INSERT = `
with raw as (
  select * from jsonb_to_recordset($1::jsonb) as x(
    line_id uuid, ts timestamptz, source text, level text, app_name text, branch text, group_slug text, service_name text,
    deployment_id text, build_id text, action_id text, instance_id text, message text, metadata jsonb)
), input as (${UNFORGOTTEN_LINES}
), stored as (
  insert into log_lines (line_id, ts, source, level, app_name, branch, group_slug, service_name, deployment_id, build_id, action_id, instance_id, message, metadata)
  select line_id, ts, source, level, app_name, branch, group_slug, service_name, deployment_id, build_id, action_id, instance_id, message, coalesce(metadata, '{}')
  from input
  on conflict (line_id) do nothing
  returning 1
), builds as (
  insert into log_builds (build_id, app_name, group_slug, first_ts, last_ts)
  select build_id, (array_agg(app_name order by ts desc))[1], (array_agg(group_slug order by ts desc))[1], min(ts), max(ts)
  from input where source = 'build' and build_id is not null
  group by build_id order by build_id
  on conflict (build_id) do update set
    app_name = coalesce(excluded.app_name, log_builds.app_name),
    group_slug = coalesce(excluded.group_slug, log_builds.group_slug),
    first_ts = least(log_builds.first_ts, excluded.first_ts),
    last_ts = greatest(log_builds.last_ts, excluded.last_ts)
  where excluded.first_ts < log_builds.first_ts or excluded.last_ts > log_builds.last_ts
    or excluded.app_name <> log_builds.app_name or excluded.group_slug <> log_builds.group_slug
    or (log_builds.app_name is null and excluded.app_name is not null) or (log_builds.group_slug is null and excluded.group_slug is not null)
), groups as (
  insert into log_groups (app_name, branch, service_name, group_slug, first_seen, last_seen)
  select app_name, branch, service_name, (array_agg(group_slug order by ts desc))[1], min(ts), max(ts)
  from input where app_name is not null and (source = 'container' or (source = 'deploy' and service_name is not null and metadata->>'phase' in (${STARTED_PHASES})))
  group by app_name, branch, service_name order by app_name, branch, service_name
  on conflict (app_name, coalesce(branch, ''), coalesce(service_name, '')) do update set
    group_slug = excluded.group_slug,
    first_seen = least(log_groups.first_seen, excluded.first_seen),
    last_seen = greatest(log_groups.last_seen, excluded.last_seen)
  where log_groups.group_slug is distinct from excluded.group_slug or excluded.first_seen < log_groups.first_seen
    or log_groups.last_seen < excluded.last_seen - interval '1 minute'
)
select (select count(*)::int from stored) as inserted, (select count(*)::int from raw) - (select count(*)::int from input) as forgotten`;

export class LogStore {
  readonly #reads: pg.Pool;
  readonly #writes: pg.Pool;
  readonly #logger: Logger;

  constructor(opts: LogStoreOptions) {
    const common = {
      connectionString: opts.url,
      // JIT compilation costs more than these short queries take.
      options: `-c search_path=${opts.schema} -c jit=off`,
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      application_name: "health-aggregator",
    };
    const timeout = opts.queryTimeoutMs ?? QUERY_TIMEOUT_MS;
    this.#reads = new pg.Pool({ ...common, max: opts.readPoolMax ?? 8, statement_timeout: timeout, query_timeout: timeout + 1000 });
    this.#writes = new pg.Pool({ ...common, max: 2, statement_timeout: 60_000 });
    this.#logger = opts.logger;
    // An idle connection that dies (Postgres restarted) must not take the process with it.
    for (const pool of [this.#reads, this.#writes]) pool.on("error", (err) => this.#logger.warn({ err }, "log store connection lost"));
  }

  /**
   * Deletes the lines older than `cutoff`, in batches of `batch` (retention.ts), and the builds
   * they were the last lines of. Returns the number of lines deleted.
   */
  async prune(cutoff: Date, batch = LOG_PRUNE_BATCH): Promise<number> {
    let deleted = 0;
    for (;;) {
      const r = await this.#writes.query(PRUNE_LINES, [cutoff, batch]);
      deleted += r.rowCount ?? 0;
      if ((r.rowCount ?? 0) < batch) break;
    }
    await this.#writes.query(PRUNE_BUILDS, [cutoff]);
    for (const sql of PRUNE_TOMBSTONES) await this.#writes.query(sql, [cutoff]);
    return deleted;
  }

  /**
   * Stores a batch with one statement, in a transaction holding the forgetting lock shared
   * (forgetting.ts): a line id already stored is skipped, a line forgotten is dropped. Returns
   * how many were stored and how many forgotten.
   */
  async insert(lines: readonly StoredLine[]): Promise<{ stored: number; forgotten: number }> {
    if (lines.length === 0) return { stored: 0, forgotten: 0 };
    return withClient(this.#writes, async (client) => {
      try {
        await client.query("begin");
        await client.query(FORGETTING_SHARED_LOCK);
        const result = await client.query<{ inserted: number; forgotten: number }>(INSERT, [JSON.stringify(lines)]);
        await client.query("commit");
        return { stored: result.rows[0]?.inserted ?? 0, forgotten: result.rows[0]?.forgotten ?? 0 };
      } catch (err) {
        await client.query("rollback").catch(() => undefined);
        throw err;
      }
    });
  }

  /**
   * GET /api/logs: checks the parameters (422s), applies the caller's scope and answers a page.
   * When the store cannot answer, an empty page with `error` (never an exception). An empty
   * container answer says why (`reason`); an answer with lines, or with `error`, never does.
   * Empty means nothing matched (total 0), not a page past the end.
   */
  async query(caller: Caller, input: LogQueryInput, now = new Date()): Promise<LogPage> {
    const q = normaliseLogQuery(input, now);
    const container = q.source === "container";
    const scope = groupScope(caller);
    if (scope.kind === "none") {
      // A caller who can see no group can see no app: for it nothing was deployed anywhere.
      const empty: LogPage = { logs: [], total: 0, hasMore: false };
      return container ? { ...empty, reason: "no_log_group" } : empty;
    }
    const { page, count } = logSql(q, scope);
    try {
      const [rows, counted] = await Promise.all([this.#reads.query<DbRow>(page), this.#reads.query<{ n: number }>(count)]);
      const logs = rows.rows.map(rowView);
      const totals = pageTotals(q, counted.rows[0]?.n ?? 0, logs.length);
      if (!container || totals.total > 0) return { logs, ...totals };
      const group = await this.#reads.query<{ found: boolean }>(logGroupSql(q, scope));
      return { logs, ...totals, reason: group.rows[0]?.found ? "no_output_yet" : "no_log_group" };
    } catch (err) {
      const error = storeFailure(err);
      if (!error) throw err;
      this.#logger.warn({ err }, "log query failed");
      return { logs: [], total: 0, hasMore: false, error };
    }
  }

  async close(): Promise<void> {
    await Promise.all([this.#reads.end(), this.#writes.end()]);
  }
}

function rowView(r: DbRow): LogRowView {
  return {
    id: r.id,
    timestamp: r.ts.toISOString(),
    source: r.source,
    level: r.level,
    app_name: r.app_name,
    service_name: r.service_name,
    deployment_id: r.deployment_id,
    build_id: r.build_id,
    action_id: r.action_id,
    instance_id: r.instance_id,
    message: r.message,
    metadata: r.metadata,
  };
}
