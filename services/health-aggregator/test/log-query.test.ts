/** The pure rules of GET /api/logs and of ingestion: no Postgres, no NATS. */
import { describe, expect, it } from "vitest";
import { makeCaller } from "@platform/caller";
import { PlatformError } from "@platform/errors";
import {
  COUNT_CAP,
  MAX_SINCE_MS,
  checkLogId,
  groupScope,
  logGroupSql,
  logSql,
  normaliseLogQuery,
  pageTotals,
  parseSince,
} from "../src/domain/log-query.ts";
import { derivedLineId, linesOfMessage } from "../src/domain/ingest.ts";
import { isDataError, storeFailure } from "../src/domain/log-store.ts";

const now = new Date("2026-11-20T12:00:00.000Z");
const minutesBefore = (m: number) => new Date(now.getTime() - m * 60_000);

function status(fn: () => unknown): number | null {
  try {
    fn();
  } catch (err) {
    return err instanceof PlatformError ? err.status : -1;
  }
  return null;
}

describe("since", () => {
  it("is relative, with a default of one hour", () => {
    expect(parseSince(undefined, now)).toEqual(minutesBefore(60));
    expect(parseSince("", now)).toEqual(minutesBefore(60));
    expect(parseSince("30s", now)).toEqual(new Date(now.getTime() - 30_000));
    expect(parseSince("30m", now)).toEqual(minutesBefore(30));
    expect(parseSince("1h", now)).toEqual(minutesBefore(60));
    expect(parseSince("24h", now)).toEqual(minutesBefore(24 * 60));
    expect(parseSince("7d", now)).toEqual(minutesBefore(7 * 24 * 60));
    expect(parseSince("2w", now)).toEqual(minutesBefore(14 * 24 * 60));
  });

  it("clamps a window past 365 days", () => {
    expect(parseSince("999999d", now)).toEqual(new Date(now.getTime() - MAX_SINCE_MS));
  });

  it("refuses anything malformed with a 422", () => {
    for (const bad of ["1", "h", "1y", "-1h", "0h", "1.5h", "1 h", "1H", "2026-11-20T10:00:00Z", "1h30m", "1234567890d"]) {
      expect(status(() => parseSince(bad, now)), bad).toBe(422);
    }
  });
});

describe("ids", () => {
  it("accept hex digits and hyphens only, lowercased", () => {
    expect(checkLogId("build_id", "ABCDEF01-2345")).toBe("abcdef01-2345");
    expect(checkLogId("build_id", "")).toBeNull();
    expect(checkLogId("build_id", undefined)).toBeNull();
    for (const bad of ["xyz", "abc_def", "abcd 1234", "abc'--", "a".repeat(65)]) expect(status(() => checkLogId("build_id", bad)), bad).toBe(422);
  });

  it("identify the owning app: app_name and branch are dropped", () => {
    const q = normaliseLogQuery({ appName: "shop", branch: "main", buildId: "abcd" }, now);
    expect(q).toMatchObject({ appName: null, branch: null, buildId: "abcd" });
  });
});

describe("normaliseLogQuery", () => {
  it("fills the defaults", () => {
    expect(normaliseLogQuery({}, now)).toEqual({
      appName: null,
      branch: null,
      source: null,
      serviceName: null,
      deploymentId: null,
      buildId: null,
      actionId: null,
      level: null,
      search: null,
      since: minutesBefore(60),
      limit: 100,
      offset: 0,
    });
  });

  it("checks limit 1-1000, offset >= 0, source, level and the search length", () => {
    expect(status(() => normaliseLogQuery({ limit: 0 }, now))).toBe(422);
    expect(status(() => normaliseLogQuery({ limit: 1001 }, now))).toBe(422);
    expect(status(() => normaliseLogQuery({ limit: 1000 }, now))).toBeNull();
    expect(status(() => normaliseLogQuery({ limit: 1 }, now))).toBeNull();
    expect(status(() => normaliseLogQuery({ offset: -1 }, now))).toBe(422);
    expect(status(() => normaliseLogQuery({ source: "kernel" }, now))).toBe(422);
    expect(status(() => normaliseLogQuery({ level: "debug" }, now))).toBe(422);
    expect(status(() => normaliseLogQuery({ search: "x".repeat(501) }, now))).toBe(422);
  });

  it("keeps branch only with app_name", () => {
    expect(normaliseLogQuery({ branch: "main" }, now).branch).toBeNull();
    expect(normaliseLogQuery({ appName: "shop", branch: "main" }, now).branch).toBe("main");
  });

  it("accepts an app's slug or canonical name", () => {
    expect(normaliseLogQuery({ appName: "My Shop" }, now).appName).toBe("my-shop");
    expect(normaliseLogQuery({ appName: "Café_API" }, now).appName).toBe("cafe-api");
  });
});

describe("groupScope", () => {
  const tenant = makeCaller({ kind: "api_key", principalId: "k", scope: "read", visibleGroups: ["acme", "other"], selectedGroup: "acme" });
  const operator = makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, selectedGroup: "" });

  it("gives a tenant the group it acts in, never more", () => {
    expect(groupScope(tenant)).toEqual({ kind: "group", slug: "acme" });
    expect(groupScope(makeCaller({ ...tenant, explicitGroup: true }))).toEqual({ kind: "group", slug: "acme" });
    const stranger = makeCaller({ kind: "api_key", principalId: "k", scope: "read", visibleGroups: ["acme"], selectedGroup: "globex", explicitGroup: true });
    expect(groupScope(stranger)).toEqual({ kind: "none" });
  });

  it("gives an operator every group unless it selected one", () => {
    expect(groupScope(operator)).toEqual({ kind: "all" });
    expect(groupScope(makeCaller({ ...operator, selectedGroup: "acme" }))).toEqual({ kind: "all" });
    expect(groupScope(makeCaller({ ...operator, selectedGroup: "acme", explicitGroup: true }))).toEqual({ kind: "group", slug: "acme" });
  });
});

describe("logSql", () => {
  it("parameterises every value and pages newest first", () => {
    const q = normaliseLogQuery({ appName: "shop", search: "x'); drop table log_lines; --", level: "error", limit: 10, offset: 20 }, now);
    const { page, count } = logSql(q, { kind: "group", slug: "acme" });
    expect(page.text).not.toContain("drop table");
    expect(page.text).toMatch(/order by ts desc, id desc limit \$\d+ offset \$\d+$/);
    expect(page.values.slice(-2)).toEqual([10, 20]);
    expect(page.text).toContain("plainto_tsquery('simple',");
    expect(count.values.at(-1)).toBe(COUNT_CAP + 1);
  });

  it("reads deploy as deploy lines plus agent lines of a deployment, and build as the recent builds' lines", () => {
    const deploy = logSql(normaliseLogQuery({ source: "deploy" }, now), { kind: "all" }).page.text;
    expect(deploy).toContain("(source = 'deploy' or (source = 'agent' and deployment_id is not null))");
    const build = logSql(normaliseLogQuery({ source: "build" }, now), { kind: "all" }).page.text;
    expect(build).toMatch(/build_id in \(select rb\.build_id from log_builds rb where .* order by rb\.first_ts desc limit 5\)/);
    for (const id of [{ buildId: "abc" }, { actionId: "abc" }, { deploymentId: "abc" }]) {
      expect(logSql(normaliseLogQuery({ source: "build", ...id }, now), { kind: "all" }).page.text).not.toContain("log_builds");
    }
  });

  it("reads container, agent and backup as exactly that source", () => {
    expect(logSql(normaliseLogQuery({ source: "container" }, now), { kind: "all" }).page.text).toContain("and source = 'container' order by");
    for (const source of ["agent", "backup"]) {
      const { page } = logSql(normaliseLogQuery({ source }, now), { kind: "all" });
      expect(page.text, source).toMatch(/and source = \$2 order by/);
      expect(page.values[1], source).toBe(source);
    }
  });
});

describe("logGroupSql", () => {
  it("looks for a log group of the app, branch and service given, within the caller's group", () => {
    const q = normaliseLogQuery({ appName: "My Shop", branch: "main", serviceName: "web", source: "container" }, now);
    const sql = logGroupSql(q, { kind: "group", slug: "acme" });
    expect(sql.text).toBe(
      "select exists (select 1 from log_groups g where g.group_slug = $1 and g.app_name = $2 and g.branch = $3 and g.service_name = $4) as found",
    );
    expect(sql.values).toEqual(["acme", "my-shop", "main", "web"]);
    expect(logGroupSql(normaliseLogQuery({ source: "container" }, now), { kind: "all" })).toEqual({
      text: "select exists (select 1 from log_groups g) as found",
      values: [],
    });
  });

  it("finds the app an id names through the lines that carry it", () => {
    const sql = logGroupSql(normaliseLogQuery({ appName: "shop", deploymentId: "ABC-1", source: "container" }, now), { kind: "all" });
    expect(sql.text).toContain("g.app_name = (select l.app_name from log_lines l where l.deployment_id = $1 limit 1)");
    expect(sql.text).not.toContain("g.app_name = $");
    expect(sql.values).toEqual(["abc-1"]);
  });
});

describe("pageTotals", () => {
  it("says has_more when offset + returned < total", () => {
    expect(pageTotals({ offset: 0, limit: 10 }, 25, 10)).toEqual({ total: 25, hasMore: true });
    expect(pageTotals({ offset: 20, limit: 10 }, 25, 5)).toEqual({ total: 25, hasMore: false });
    expect(pageTotals({ offset: 30, limit: 10 }, 25, 0)).toEqual({ total: 25, hasMore: false });
  });

  it("reports a capped count as the bound plus one, a lower bound that keeps has_more exact", () => {
    expect(pageTotals({ offset: 0, limit: 100 }, COUNT_CAP + 1, 100)).toEqual({ total: COUNT_CAP + 1, hasMore: true });
    expect(pageTotals({ offset: 20_000, limit: 100 }, 20_101, 100)).toEqual({ total: 20_101, hasMore: true });
  });
});

describe("ingestion", () => {
  it("derives a stable UUID for a line that came without an id", () => {
    const a = derivedLineId("LOGS", 42, 0);
    expect(a).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(derivedLineId("LOGS", 42, 0)).toBe(a);
    expect(derivedLineId("LOGS", 42, 1)).not.toBe(a);
    expect(derivedLineId("LOGS", 43, 0)).not.toBe(a);
  });

  it("keeps the shipper's line id and derives the others", () => {
    const id = "0b4e3c0a-1111-4222-8333-444455556666";
    const { lines, rejected } = linesOfMessage(
      JSON.stringify([
        { id, ts: now.toISOString(), source: "agent", level: "info", message: "a" },
        { ts: now.toISOString(), source: "nope", level: "info", message: "b" },
        { ts: now.toISOString(), source: "agent", level: "info", message: "c" },
      ]),
      "LOGS",
      7,
    );
    expect(lines.map((l) => l.line_id)).toEqual([id, derivedLineId("LOGS", 7, 1)]);
    expect(rejected).toHaveLength(1);
  });

  it("tells data errors (never retried) from store failures (retried, or the API's error key)", () => {
    expect(isDataError({ code: "22P02" })).toBe(true);
    expect(isDataError({ code: "23514" })).toBe(true);
    expect(isDataError({ code: "08006" })).toBe(false);
    expect(isDataError(new Error("x"))).toBe(false);
    expect(storeFailure({ code: "ECONNREFUSED", message: "connect ECONNREFUSED 127.0.0.1:1" })).toMatch(/unreachable/);
    expect(storeFailure({ code: "57P01", message: "terminating connection due to administrator command" })).toMatch(/unreachable/);
    expect(storeFailure(new Error("timeout exceeded when trying to connect"))).toMatch(/unreachable/);
    expect(storeFailure({ code: "57014", message: "canceling statement due to statement timeout" })).toMatch(/took too long/);
    expect(storeFailure({ code: "42601", message: "syntax error" })).toBeNull();
  });
});
