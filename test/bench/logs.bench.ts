/**
 * GET /api/logs with a full-text search over 1 000 000 stored lines (issue: logs, first sources,
 * benchmark c). Target: p99 under 200 ms.
 *
 * A fleet is started (no agent), 1 000 000 varied lines are written straight into
 * health-aggregator's `log_lines` with one generate_series INSERT (the table's indexes are
 * dropped for the load and rebuilt from their own definitions after, then VACUUM ANALYZE, as
 * autovacuum would leave a table that size), and 200 searches with varied terms go through the
 * gateway one after another: as an operator over every group, as a tenant (its group only) and
 * for one app. The baseline is the same SQL the service runs (page and count, side by side),
 * sent straight to Postgres with pg (and the service's session settings) for the same 200
 * searches in the same run. BENCH_LOG_LINES changes the number of lines.
 */
import pg from "pg";
import { makeCaller } from "@platform/caller";
import { startTestFleet } from "@platform/testing";
import { groupScope, logSql, normaliseLogQuery, type LogQueryInput } from "../../services/health-aggregator/src/domain/log-query.ts";
import type { Verdict } from "./lib.ts";

const LINES = Number(process.env.BENCH_LOG_LINES ?? 1_000_000);
const QUERIES = 200;
const TARGET_P99_MS = 200;
const SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "to", "vi", "sa", "po", "de", "fi", "gu", "ha", "je", "ko", "ly", "ma", "no", "pe", "qu", "ri", "su", "te", "vo", "wa", "xe", "yo", "zu"];
const VOCABULARY = SYLLABLES.length ** 3;
const DAYS = 8;
const APPS = 200;
const GROUPS = 40;
const TENANT_GROUP = "g07";

/**
 * A vocabulary word (identifiers: users, keys, tables, hosts...): three syllables, one word per
 * k < 28^3. The SQL below builds the same words.
 */
export function word(k: number): string {
  const n = SYLLABLES.length;
  return `${SYLLABLES[k % n]}${SYLLABLES[Math.floor(k / n) % n]}${SYLLABLES[Math.floor(k / (n * n)) % n]}`;
}

const SQL_WORD = (k: string) => `(s[1 + (${k}) % 28] || s[1 + ((${k}) / 28) % 28] || s[1 + ((${k}) / 784) % 28])`;

/**
 * 1M lines over 8 days (in arrival order, as ingestion stores them, give or take a few seconds), 200 apps in 40 groups, every source and level, ~20 message templates
 * filled with vocabulary words drawn with a skew (k = V * u^2.5): a few words are in thousands of
 * lines, most in tens to hundreds, as identifiers are in real logs.
 */
export const GENERATE = `
insert into log_lines (line_id, ts, source, level, app_name, branch, group_slug, service_name, deployment_id, build_id, action_id, instance_id, message, metadata)
select
  md5('bench-line-' || i)::uuid,
  now() - ((${LINES} - i)::float8 / ${LINES}) * interval '${DAYS} days' - u_ts * interval '5 seconds',
  src,
  case when u_lvl < 0.85 then 'info' when u_lvl < 0.95 then 'warning' else 'error' end,
  'app-' || lpad(app::text, 3, '0'),
  case when app % 4 = 0 then 'dev' else 'main' end,
  'g' || lpad((app % ${GROUPS})::text, 2, '0'),
  (array['web', 'worker', 'api', 'cron'])[1 + i % 4],
  case when src = 'deploy' or (src = 'agent' and i % 3 = 0) then md5('dep-' || app || '-' || (i / 50000))::uuid::text end,
  case when src = 'build' then md5('build-' || app || '-' || (i / 20000))::uuid::text end,
  case when src = 'build' then md5('build-' || app || '-' || (i / 20000))::uuid::text when src = 'deploy' then md5('dep-' || app || '-' || (i / 50000))::uuid::text end,
  'host-' || (i % 5),
  case tpl
    when 0 then 'GET /api/' || w1 || '/' || (i % 9973) || ' 200 in ' || (i % 480) || ' ms'
    when 1 then 'POST /api/' || w1 || ' 201 in ' || (i % 900) || ' ms'
    when 2 then 'user ' || w1 || ' signed in from 10.0.' || (i % 250) || '.' || (i % 199)
    when 3 then 'connection to ' || w1 || ':5432 refused, retrying in ' || (i % 30) || ' s'
    when 4 then 'cache miss for key ' || w1 || ':' || w2
    when 5 then 'job ' || w1 || ' finished in ' || (i % 7000) || ' ms'
    when 6 then 'npm ERR! could not resolve dependency ' || w1 || '@' || (i % 9) || '.' || (i % 17) || '.0'
    when 7 then 'Step ' || (1 + i % 12) || '/12 : RUN npm ci --omit=dev (' || w1 || ')'
    when 8 then 'deploying ' || w1 || ' to host-' || (i % 5)
    when 9 then 'health check passed for ' || w1 || ' on port ' || (8000 + i % 100)
    when 10 then 'warning: deprecated option ' || w1 || ' in platform.yaml, use ' || w2
    when 11 then 'TypeError: Cannot read properties of undefined (reading ''' || w1 || ''') at ' || w2 || '.js:' || (i % 400)
    when 12 then 'payment ' || w1 || ' declined: insufficient funds for order ' || w2
    when 13 then 'sent email to ' || w1 || '@example.com with template ' || w2
    when 14 then 'worker ' || w1 || ' picked up task ' || w2 || ' from the queue'
    when 15 then 'slow query on table ' || w1 || ' took ' || (i % 5000) || ' ms'
    when 16 then 'uploaded ' || w1 || '.png (' || (i % 900) || ' KB) to bucket ' || w2
    when 17 then 'session expired for user ' || w1
    when 18 then 'retrying webhook delivery to ' || w1 || ' (attempt ' || (1 + i % 5) || ')'
    else 'container exited with code 137 after an OOM kill in ' || w1
  end,
  jsonb_build_object('request_id', substr(md5(i::text), 1, 12), 'duration_ms', i % 3000)
from (
  select i, u_ts, u_lvl, app, src, tpl, ${SQL_WORD("k1")} as w1, ${SQL_WORD("k2")} as w2
  from (
    select i,
      random() as u_ts,
      random() as u_lvl,
      floor(random() * ${APPS})::int as app,
      floor(random() * 20)::int as tpl,
      (array['container', 'container', 'container', 'container', 'container', 'agent', 'agent', 'agent', 'build', 'build', 'build', 'build', 'deploy', 'deploy', 'backup'])[1 + floor(random() * 15)::int] as src,
      floor(${VOCABULARY} * power(random(), 2.5))::int as k1,
      floor(${VOCABULARY} * power(random(), 2.5))::int as k2
    from generate_series(1, ${LINES}) as i
  ) draws, (select array[${SYLLABLES.map((s) => `'${s}'`).join(", ")}] as s) syllables
) lines`;

/** What ingestion keeps beside the lines that the query reads: the builds (source=build). */
export const DERIVED = [
  `insert into log_builds (build_id, app_name, group_slug, first_ts, last_ts)
   select build_id, min(app_name), min(group_slug), min(ts), max(ts) from log_lines where source = 'build' and build_id is not null group by build_id`,
];

interface Timing {
  p50: number;
  p99: number;
  max: number;
}

function timing(samples: number[]): Timing {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? 0;
  return { p50: at(0.5), p99: at(0.99), max: sorted.at(-1) ?? 0 };
}

const fmt = (t: Timing) => `p50 ${t.p50.toFixed(1)} ms, p99 ${t.p99.toFixed(1)} ms, max ${t.max.toFixed(1)} ms`;

type Who = "operator" | "tenant";
interface Search {
  who: Who;
  params: Record<string, string>;
}

/** 200 searches: one or two vocabulary words (a few hundred to a few thousand lines each), some with a template word. */
function searches(): Search[] {
  let seed = 42;
  const random = () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const out: Search[] = [];
  for (let n = 0; n < QUERIES; n++) {
    // Word ranks even on a log scale: over every group, rank 1 to 300 is ~3 000 down to ~100 lines.
    const rank = (max: number) => Math.floor(Math.exp(random() * Math.log(max + 1))) - 1;
    const kind = n % 5;
    const since = n % 10 === 9 ? "24h" : "7d";
    if (kind === 0 || kind === 1) out.push({ who: "operator", params: { search: word(1 + rank(300)), since } });
    else if (kind === 2) out.push({ who: "operator", params: { search: `${["user", "payment", "job", "cache", "worker"][n % 5]} ${word(rank(30))}`, since } });
    // One group or one app holds a fortieth or a two-hundredth of the lines: their searches use commoner words.
    else if (kind === 3) out.push({ who: "tenant", params: { search: word(rank(10)), since } });
    else out.push({ who: "operator", params: { app_name: `app-${String((n * 37) % APPS).padStart(3, "0")}`, search: word(rank(3)), since } });
  }
  return out;
}

async function post(url: string, key: string, body: unknown): Promise<Record<string, unknown>> {
  const res = await fetch(url, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body: JSON.stringify(body) });
  if (res.status !== 201) throw new Error(`POST ${url}: ${res.status} ${await res.text()}`);
  return (await res.json()) as Record<string, unknown>;
}

export async function run(): Promise<Verdict[]> {
  const started = performance.now();
  const fleet = await startTestFleet({ agent: false, env: { LOG_LEVEL: "warn" } });
  const pool = new pg.Pool({ connectionString: fleet.databaseUrl, max: 4, options: "-c search_path=health_aggregator -c jit=off" });
  try {
    await post(`${fleet.api}/groups`, fleet.rootKey, { slug: TENANT_GROUP });
    const tenantKey = String((await post(`${fleet.api}/keys`, fleet.rootKey, { name: "bench-tenant", scope: "read", group: TENANT_GROUP })).key);
    const keys: Record<Who, string> = { operator: fleet.rootKey, tenant: tenantKey };
    const fleetReady = performance.now();

    // Load: without the indexes, then rebuild each from its own definition.
    const db = await pool.connect();
    try {
      const indexes = await db.query<{ name: string; def: string }>(
        "select indexname as name, indexdef as def from pg_indexes where schemaname = 'health_aggregator' and tablename = 'log_lines' and indexname <> 'log_lines_pkey'",
      );
      for (const { name } of indexes.rows) await db.query(`drop index ${pg.escapeIdentifier(name)}`);
      await db.query("set maintenance_work_mem = '512MB'");
      await db.query(GENERATE);
      for (const sql of DERIVED) await db.query(sql);
      const loaded = performance.now();
      for (const { def } of indexes.rows) await db.query(def);
      await db.query("vacuum analyze log_lines, log_builds");
      console.log(
        `loaded ${LINES.toLocaleString("en")} lines in ${((loaded - fleetReady) / 1000).toFixed(1)} s, ` +
          `${indexes.rows.length} indexes rebuilt and vacuumed in ${((performance.now() - loaded) / 1000).toFixed(1)} s`,
      );
    } finally {
      db.release();
    }

    const plan = searches();
    const url = (s: Search) => `${fleet.api}/logs?${new URLSearchParams(s.params).toString()}`;
    const hits: number[] = [];
    let failures = 0;
    const viaGateway = async (s: Search): Promise<number> => {
      const t = performance.now();
      const res = await fetch(url(s), { headers: { authorization: `Bearer ${keys[s.who]}` } });
      const body = (await res.json()) as { total?: number; error?: string };
      const ms = performance.now() - t;
      if (res.status !== 200 || body.error !== undefined) {
        failures++;
        if (failures <= 3) console.log(`  ${url(s)} -> ${res.status} ${JSON.stringify(body)}`);
      }
      hits.push(body.total ?? 0);
      return ms;
    };

    const now = new Date();
    const callers = {
      operator: makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true }),
      tenant: makeCaller({ kind: "api_key", principalId: "tenant", scope: "read", visibleGroups: [TENANT_GROUP], selectedGroup: TENANT_GROUP }),
    };
    const direct = async (s: Search): Promise<number> => {
      const input: LogQueryInput = { search: s.params.search, since: s.params.since, appName: s.params.app_name };
      const scope = groupScope(callers[s.who]);
      if (scope.kind === "none") throw new Error("no scope");
      const { page, count } = logSql(normaliseLogQuery(input, now), scope);
      const t = performance.now();
      await Promise.all([pool.query(page), pool.query(count)]);
      return performance.now() - t;
    };

    // Warm both paths (connections, JIT, the plan cache of the catalog), then measure.
    for (const s of plan.slice(0, 20)) {
      await viaGateway(s);
      await direct(s);
    }
    hits.length = 0;
    failures = 0;
    const baselineMs: number[] = [];
    for (const s of plan) baselineMs.push(await direct(s));
    const gatewayMs: number[] = [];
    for (const s of plan) gatewayMs.push(await viaGateway(s));

    const sortedHits = [...hits].sort((a, b) => a - b);
    console.log(
      `${plan.length} searches matched ${sortedHits[0]} to ${sortedHits.at(-1)} lines (median ${sortedHits[Math.floor(sortedHits.length / 2)]}; ` +
        `total is counted up to 10 000)`,
    );
    const subject = timing(gatewayMs);
    const baseline = timing(baselineMs);
    for (const who of ["operator", "tenant"] as const) {
      const mine = gatewayMs.filter((_, i) => plan[i]!.who === who);
      console.log(`  ${who} searches (${mine.length}): ${fmt(timing(mine))}`);
    }
    const ok = subject.p99 < TARGET_P99_MS && failures === 0;
    console.log(
      `GET /api/logs full-text search over ${LINES.toLocaleString("en")} lines: ${fmt(subject)} vs baseline (same SQL straight to Postgres) ${fmt(baseline)}; ` +
        `target p99 < ${TARGET_P99_MS} ms ${ok ? "PASS" : "FAIL"}${failures ? ` [${failures} failed requests]` : ""} ` +
        `(whole benchmark ${((performance.now() - started) / 1000).toFixed(0)} s)`,
    );
    return [{ name: "GET /api/logs full-text p99", ok }];
  } finally {
    await pool.end();
    await fleet.stop();
  }
}
