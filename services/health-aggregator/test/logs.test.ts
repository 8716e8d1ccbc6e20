/**
 * Logs end to end inside health-aggregator, against the real Postgres and NATS JetStream: lines
 * shipped with LogShipper are ingested in batches and served by QueryLogs with every rule of
 * spec doc 1 section 4.6 (filters, source semantics, tenancy, full-text search, paging), and
 * follow their group's rename or deletion.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { healthAggregatorEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { HealthAggregatorService, type QueryLogsRequest } from "@platform/proto";
import { makeCaller, type Caller } from "@platform/caller";
import { connectBus, subjects, type Bus } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { LogShipper, type LogLineInput } from "@platform/logship";
import { createTestDatabase, deleteBusStreams, dropDatabase, freePort, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { QueryLogsRequestSchema } from "@platform/proto";
import { build, type HealthAggregator } from "../src/app.ts";
import { LogStore } from "../src/domain/log-store.ts";
import type { StoredLine } from "../src/domain/ingest.ts";
import { LOG_CONSUMER } from "../src/log-ingestion.ts";
import { logRetentionCutoff } from "../src/domain/retention.ts";
import { routes } from "../src/rpc.ts";

const logger = createLogger({ service: "health-aggregator-test", level: "silent", pretty: false });

let databaseUrl: string;
let prefix: string;
let service: HealthAggregator;
let client: ReturnType<typeof createServiceClient<typeof HealthAggregatorService>>;
let bus: Bus;
let shipper: LogShipper;
let db: pg.Client;
/** Set to make the next committed batch fail before its acknowledgement (a crash between the two). */
let failNextAck = false;

const operator = makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, platformRoot: true });
const tenant = (group: string) => makeCaller({ kind: "api_key", principalId: `k-${group}`, scope: "read", visibleGroups: [group], selectedGroup: group });

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  service = await build(
    loadConfig(healthAggregatorEnv, {
      DATABASE_URL: databaseUrl,
      NATS_URL: testNatsUrl(),
      BUS_PREFIX: prefix,
      RPC_PORT: "0",
      LOG_LEVEL: "silent",
    }),
    {
      ingestion: {
        maxDelayMs: 50,
        afterCommit() {
          if (failNextAck) {
            failNextAck = false;
            throw new Error("simulated crash between commit and acknowledgement");
          }
        },
      },
    },
  );
  client = createServiceClient(HealthAggregatorService, `http://127.0.0.1:${service.rpc.port}`);
  bus = await connectBus({ url: testNatsUrl(), name: "health-aggregator-test", prefix });
  shipper = new LogShipper({ bus, defaults: { instance_id: "host-1" }, logger });
  db = new pg.Client({ connectionString: databaseUrl, options: "-c search_path=health_aggregator" });
  await db.connect();
});

afterAll(async () => {
  await shipper?.close();
  await db?.end();
  await bus?.close();
  await service?.close();
  await dropDatabase(databaseUrl);
  await deleteBusStreams(prefix);
});

async function count(where = "true", values: unknown[] = []): Promise<number> {
  const r = await db.query<{ n: number }>(`select count(*)::int as n from log_lines where ${where}`, values);
  return r.rows[0]!.n;
}

/** Ships lines and waits until the store holds `expected` rows matching `where`. */
async function shipAndWait(lines: LogLineInput[], where: string, values: unknown[], expected = lines.length): Promise<void> {
  for (const line of lines) expect(shipper.ship(line)).toBe(true);
  await shipper.flush();
  await until(async () => (await count(where, values)) === expected, `${expected} rows where ${where}`);
}

/** Polls `ok` (usable in hooks, where expect.poll is not). */
async function until(ok: () => Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await ok())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

type Query = Omit<MessageInitShape<typeof QueryLogsRequestSchema>, "caller">;

function query(caller: Caller, q: Query = {}) {
  return client.queryLogs({ caller, ...q } as QueryLogsRequest);
}


const ago = (ms: number) => new Date(Date.now() - ms).toISOString();
const MIN = 60_000;
const HOUR = 60 * MIN;
const DAY = 24 * HOUR;

describe("ingestion", () => {
  it("stores lines shipped with LogShipper in batches, and serves them", async () => {
    const lines: LogLineInput[] = Array.from({ length: 300 }, (_, i) => ({
      ts: ago(30 * MIN - i * 1000),
      source: "agent",
      app_name: "batch-app",
      group_slug: "ingest",
      branch: "main",
      message: `batched line ${i}`,
      metadata: { i },
    }));
    const before = service.ingestion.stats();
    await shipAndWait(lines, "app_name = $1", ["batch-app"]);
    const after = service.ingestion.stats();
    expect(after.stored - before.stored).toBe(300);
    // 300 lines travel as at least 3 messages and are stored in far fewer batches than lines.
    expect(after.batches - before.batches).toBeLessThanOrEqual(after.messages - before.messages);
    expect(after.batches - before.batches).toBeLessThan(20);

    const r = await query(operator, { appName: "batch-app", limit: 1000 });
    expect(r.total).toBe(300);
    expect(r.logs.map((l) => l.message)).toEqual(lines.map((l) => l.message).reverse());
    expect(r.logs[0]).toMatchObject({ source: "agent", level: "info", appName: "batch-app", instanceId: "host-1" });
    expect(r.logs[0]!.serviceName).toBeUndefined();
    expect(JSON.parse(r.logs[0]!.metadataJson)).toEqual({ i: 299 });
    expect(typeof r.logs[0]!.id).toBe("bigint");
  });

  it("stores a redelivered batch once", async () => {
    failNextAck = true;
    const before = service.ingestion.stats();
    const lines: LogLineInput[] = Array.from({ length: 20 }, (_, i) => ({ source: "agent", app_name: "redelivered", group_slug: "ingest", message: `again ${i}` }));
    await shipAndWait(lines, "app_name = $1", ["redelivered"]);
    // The nak'd batch comes back after its retry delay and every line is found already stored.
    await expect.poll(() => service.ingestion.stats().duplicates - before.duplicates, { timeout: 15_000 }).toBe(20);
    expect(failNextAck).toBe(false);
    expect(await count("app_name = $1", ["redelivered"])).toBe(20);
  });

  it("stores a batch published twice once, and lines without ids once per delivery of their message", async () => {
    const subject = bus.subject(subjects.logs("twice", "agent"));
    const withIds = JSON.stringify(
      [1, 2, 3].map((i) => ({ id: randomUUID(), ts: new Date().toISOString(), source: "agent", level: "info", app_name: "twice", message: `line ${i}` })),
    );
    // A publish repeated after the duplicate window: a new message id, the same lines.
    await bus.js.publish(subject, withIds, { msgID: randomUUID() });
    await bus.js.publish(subject, withIds, { msgID: randomUUID() });
    await expect.poll(() => count("app_name = $1", ["twice"]), { timeout: 10_000 }).toBe(3);

    // Lines without an id get one from their stream position: a redelivery finds them stored.
    failNextAck = true;
    const before = service.ingestion.stats();
    const raw = JSON.stringify([4, 5].map((i) => ({ ts: new Date().toISOString(), source: "agent", level: "info", app_name: "twice", message: `raw ${i}` })));
    await bus.js.publish(subject, raw);
    await expect.poll(() => service.ingestion.stats().duplicates - before.duplicates, { timeout: 15_000 }).toBe(2);
    expect(await count("app_name = $1", ["twice"])).toBe(5);
  });

  it("drops invalid lines and messages without jamming the consumer", async () => {
    const subject = bus.subject(subjects.logs("messy", "agent"));
    const before = service.ingestion.stats();
    await bus.js.publish(subject, "this is not json");
    await bus.js.publish(subject, "42");
    await bus.js.publish(
      subject,
      JSON.stringify([
        { ts: new Date().toISOString(), source: "agent", level: "loud", app_name: "messy", message: "bad level" },
        { ts: new Date().toISOString(), source: "agent", level: "info", app_name: "messy", message: "good one" },
        { ts: "not a time", source: "agent", level: "info", app_name: "messy", message: "bad ts" },
        { ts: new Date().toISOString(), source: "agent", level: "info", app_name: "messy", message: "nul \u0000 byte and lone \ud800 surrogate" },
      ]),
    );
    await shipAndWait([{ source: "agent", app_name: "messy", message: "after the mess" }], "app_name = $1", ["messy"], 3);
    const after = service.ingestion.stats();
    expect(after.terminated - before.terminated).toBe(2);
    expect(after.rejectedLines - before.rejectedLines).toBe(2);
    const stored = await db.query<{ message: string }>("select message from log_lines where app_name = 'messy' order by id");
    expect(stored.rows.map((r) => r.message)).toEqual(["good one", "nul \uFFFD byte and lone \uFFFD surrogate", "after the mess"]);
    // Nothing waits for an acknowledgement or a redelivery.
    await expect
      .poll(async () => {
        const info = await bus.jsm.consumers.info(subjects.streams(prefix).logs.name, LOG_CONSUMER);
        return info.num_pending + info.num_ack_pending;
      }, { timeout: 10_000 })
      .toBe(0);
  });

  it("refuses in the store what breaks its rules, as a data error ingestion can skip", async () => {
    const err = await service.store
      .insert([
        {
          line_id: randomUUID(),
          ts: new Date().toISOString(),
          source: "kernel" as "agent",
          level: "info",
          app_name: null,
          branch: null,
          group_slug: null,
          service_name: null,
          deployment_id: null,
          build_id: null,
          action_id: null,
          instance_id: null,
          message: "x",
          metadata: {},
        },
      ])
      .catch((e: unknown) => e);
    expect((err as { code?: string }).code).toBe("23514");
  });
});

// Ids used by the dataset below (hex-or-hyphen, as the platform's UUIDs are).
const D1 = "d1d1d1d1-0000-4000-8000-000000000001";
const D2 = "d2d2d2d2-0000-4000-8000-000000000002";
const ACT1 = "acacacac-0000-4000-8000-000000000001";
const buildN = (n: number) => `b0b0b0b0-0000-4000-8000-00000000000${n}`;
const ROCKET_BUILD = "b0b0b0b0-0000-4000-8000-0000000000ff";

describe("queries", () => {
  const shopOneHour: string[] = [];

  beforeAll(async () => {
    const shop = { app_name: "shop", group_slug: "acme", branch: "main" };
    const lines: LogLineInput[] = [
      { ...shop, ts: ago(5 * MIN), source: "agent", service_name: "web", message: "server listening on port 8080" },
      { ...shop, ts: ago(10 * MIN), source: "agent", level: "warning", service_name: "web", deployment_id: D1, message: "slow request GET /checkout took 2300 ms" },
      { ...shop, ts: ago(12 * MIN), source: "deploy", service_name: "web", deployment_id: D1, action_id: ACT1, message: "deploy started for tag main-abc" },
      { ...shop, ts: ago(15 * MIN), source: "deploy", level: "error", service_name: "worker", deployment_id: D1, message: "Health check failed: connection refused" },
      { ...shop, ts: ago(20 * MIN), source: "container", level: "error", service_name: "worker", message: "payment gateway timeout after 30 s" },
      { ...shop, ts: ago(25 * MIN), source: "backup", message: "backup bundle written", metadata: { bytes: 1024, files: ["db.dump"] } },
      { ...shop, branch: "feature-x", ts: ago(4 * MIN), source: "agent", service_name: "web", message: "preview ready" },
      { ...shop, ts: ago(2 * HOUR), source: "agent", service_name: "web", message: "old line from two hours ago" },
      { ...shop, ts: ago(8 * DAY), source: "agent", service_name: "web", message: "very old line" },
      // Seven builds, the newest last; two lines each.
      ...[1, 2, 3, 4, 5, 6, 7].flatMap((n): LogLineInput[] => [
        { ...shop, ts: ago((45 - n * 3) * MIN), source: "build", build_id: buildN(n), action_id: buildN(n), message: `build ${n} step compiling assets` },
        { ...shop, ts: ago((44 - n * 3) * MIN), source: "build", build_id: buildN(n), action_id: buildN(n), message: `build ${n} finished` },
      ]),
      { app_name: "rocket", group_slug: "globex", branch: "main", ts: ago(5 * MIN), source: "agent", deployment_id: D2, message: "rocket engine ignition" },
      { app_name: "rocket", group_slug: "globex", branch: "main", ts: ago(6 * MIN), source: "build", build_id: ROCKET_BUILD, message: "build finished" },
      { ts: ago(3 * MIN), source: "agent", message: "platform agent started" },
    ];
    await shipAndWait(lines, "app_name in ('shop', 'rocket') or (app_name is null and group_slug is null)", [], lines.length);
    const rows = await db.query<{ message: string }>("select message from log_lines where app_name = 'shop' and ts > now() - interval '1 hour' order by ts desc, id desc");
    shopOneHour.push(...rows.rows.map((r) => r.message));
    expect(shopOneHour).toHaveLength(21);
  });

  const messages = async (caller: Caller, q: Query = {}) => (await query(caller, q)).logs.map((l) => l.message);

  it("answers the last hour of an app, newest first, in the log row shape", async () => {
    const r = await query(operator, { appName: "shop" });
    expect(r.logs.map((l) => l.message)).toEqual(shopOneHour);
    expect(r).toMatchObject({ total: 21, hasMore: false });
    expect(r.error).toBeUndefined();
    const backup = r.logs.find((l) => l.source === "backup")!;
    expect(backup).toMatchObject({ level: "info", appName: "shop", instanceId: "host-1" });
    expect([backup.serviceName, backup.deploymentId, backup.buildId, backup.actionId]).toEqual([undefined, undefined, undefined, undefined]);
    expect(JSON.parse(backup.metadataJson)).toEqual({ bytes: 1024, files: ["db.dump"] });
    const times = r.logs.map((l) => Date.parse(l.timestamp));
    expect(times).toEqual([...times].sort((a, b) => b - a));
  });

  it("finds an app by its canonical name too", async () => {
    expect((await query(operator, { appName: "Shop" })).total).toBe(21);
  });

  it("reads the window given by since", async () => {
    // Seven lines of the last 25 minutes, and the lines of builds 5 (its last), 6 and 7.
    expect((await query(operator, { appName: "shop", since: "30m" })).total).toBe(12);
    expect((await query(operator, { appName: "shop", since: "3h" })).total).toBe(22);
    expect((await query(operator, { appName: "shop", since: "7d" })).total).toBe(22);
    expect((await query(operator, { appName: "shop", since: "9d" })).total).toBe(23);
    for (const since of ["1y", "abc", "0h", "-1h"]) {
      expect(await refusal(query(operator, { appName: "shop", since })), since).toMatchObject({ status: 422 });
    }
  });

  it("matches agent and backup and container exactly, and deploy as deploy lines plus agent lines of a deployment", async () => {
    expect(await messages(operator, { appName: "shop", source: "agent" })).toEqual([
      "preview ready",
      "server listening on port 8080",
      "slow request GET /checkout took 2300 ms",
    ]);
    expect(await messages(operator, { appName: "shop", source: "deploy" })).toEqual([
      "slow request GET /checkout took 2300 ms",
      "deploy started for tag main-abc",
      "Health check failed: connection refused",
    ]);
    expect(await messages(operator, { appName: "shop", source: "container" })).toEqual(["payment gateway timeout after 30 s"]);
    expect(await messages(operator, { appName: "shop", source: "backup" })).toEqual(["backup bundle written"]);
  });

  it("reads build as the lines of the 5 most recent builds, or of the build named", async () => {
    const recent = await query(operator, { appName: "shop", source: "build" });
    expect(new Set(recent.logs.map((l) => l.buildId))).toEqual(new Set([3, 4, 5, 6, 7].map(buildN)));
    expect(recent.total).toBe(10);
    expect(await messages(operator, { source: "build", buildId: buildN(1) })).toEqual(["build 1 finished", "build 1 step compiling assets"]);
    // A build's action id names it as well (an id names its build: no most-recent rule then).
    expect(await messages(operator, { source: "build", actionId: buildN(2) })).toEqual(["build 2 finished", "build 2 step compiling assets"]);
    // A tenant's most recent builds are its group's.
    const acme = await query(tenant("acme"), { source: "build" });
    expect(new Set(acme.logs.map((l) => l.buildId))).toEqual(new Set([3, 4, 5, 6, 7].map(buildN)));
    // Operators without app_name: the most recent builds of every app.
    const all = await query(operator, { source: "build" });
    expect(new Set(all.logs.map((l) => l.buildId))).toEqual(new Set([ROCKET_BUILD, ...[4, 5, 6, 7].map(buildN)]));
  });

  it("filters by service_name and level", async () => {
    expect(await messages(operator, { appName: "shop", serviceName: "worker" })).toEqual([
      "Health check failed: connection refused",
      "payment gateway timeout after 30 s",
    ]);
    expect(await messages(operator, { appName: "shop", level: "error" })).toEqual(["Health check failed: connection refused", "payment gateway timeout after 30 s"]);
    expect(await messages(operator, { appName: "shop", level: "warning" })).toEqual(["slow request GET /checkout took 2300 ms"]);
    expect(await refusal(query(operator, { level: "debug" }))).toMatchObject({ status: 422 });
    expect(await refusal(query(operator, { source: "kernel" }))).toMatchObject({ status: 422 });
  });

  it("searches the full text of message: whole words, any case, every word", async () => {
    expect(await messages(operator, { search: "connection refused" })).toEqual(["Health check failed: connection refused"]);
    expect(await messages(operator, { search: "REFUSED Connection" })).toEqual(["Health check failed: connection refused"]);
    expect(await messages(operator, { search: "payment timeout" })).toEqual(["payment gateway timeout after 30 s"]);
    expect(await messages(operator, { search: "conn" })).toEqual([]);
    expect(await messages(operator, { search: "payment refused" })).toEqual([]);
    expect(await messages(operator, { search: "finished", appName: "rocket" })).toEqual(["build finished"]);
    expect((await query(operator, { search: "finished", appName: "shop" })).total).toBe(7);
    expect(await messages(operator, { search: "!!! ???" })).toEqual([]);
    // Punctuation separates words: those inside a path or a hyphenated tag are found, by
    // themselves or written as they stand.
    expect(await messages(operator, { search: "checkout" })).toEqual(["slow request GET /checkout took 2300 ms"]);
    expect(await messages(operator, { search: "GET /checkout" })).toEqual(["slow request GET /checkout took 2300 ms"]);
    expect(await messages(operator, { search: "abc" })).toEqual(["deploy started for tag main-abc"]);
    expect(await messages(operator, { search: "tag main-abc" })).toEqual(["deploy started for tag main-abc"]);
  });

  it("takes an id as naming the owning app: app_name and branch are ignored", async () => {
    expect(await messages(operator, { deploymentId: D1, appName: "rocket", branch: "nope" })).toEqual([
      "slow request GET /checkout took 2300 ms",
      "deploy started for tag main-abc",
      "Health check failed: connection refused",
    ]);
    expect(await messages(operator, { actionId: ACT1.toUpperCase() })).toEqual(["deploy started for tag main-abc"]);
    expect(await messages(operator, { buildId: buildN(7), appName: "rocket" })).toEqual(["build 7 finished", "build 7 step compiling assets"]);
    for (const field of ["deploymentId", "buildId", "actionId"] as const) {
      expect(await refusal(query(operator, { [field]: "not-an-id!" })), field).toMatchObject({ status: 422 });
    }
  });

  it("keeps tenants to their own group: another group's app or id reads like an unknown one", async () => {
    const acme = tenant("acme");
    const globex = tenant("globex");
    expect((await query(acme, {})).total).toBe(21);
    expect(await messages(globex, {})).toEqual(["rocket engine ignition", "build finished"]);
    expect(await query(acme, { appName: "rocket" })).toMatchObject({ logs: [], total: 0, hasMore: false });
    expect(await query(acme, { deploymentId: D2 })).toMatchObject({ logs: [], total: 0 });
    expect(await query(acme, { buildId: ROCKET_BUILD })).toMatchObject({ logs: [], total: 0 });
    expect(await query(acme, { appName: "no-such-app" })).toMatchObject({ logs: [], total: 0 });
    expect((await query(globex, { deploymentId: D1 })).total).toBe(0);
    expect((await query(acme, { deploymentId: D1 })).total).toBe(3);
    // Platform lines (no group) are for operators only.
    expect(await messages(acme, { search: "platform" })).toEqual([]);
    expect(await messages(operator, { search: "platform" })).toEqual(["platform agent started"]);
    // A selected group the caller is not a member of sees nothing.
    const stray = makeCaller({ kind: "api_key", principalId: "k", scope: "read", visibleGroups: ["acme"], selectedGroup: "globex", explicitGroup: true });
    expect((await query(stray)).total).toBe(0);
  });

  it("lets an operator read every group, or the group it selected", async () => {
    const all = await query(operator, { limit: 1000 });
    const apps = new Set(all.logs.map((l) => l.appName ?? null));
    for (const app of ["shop", "rocket", null]) expect(apps.has(app), String(app)).toBe(true);
    const selected = makeCaller({ ...operator, selectedGroup: "globex", explicitGroup: true });
    expect(await messages(selected)).toEqual(["rocket engine ignition", "build finished"]);
    expect((await query(makeCaller({ ...operator, selectedGroup: "globex" }))).total).toBe(all.total);
  });

  it("filters no line by branch: its access check is the gateway's, against the registered branches", async () => {
    // Every branch's lines of the app come back, whichever branch is named, lines or none.
    expect((await query(operator, { appName: "shop", branch: "main" })).total).toBe(21);
    expect((await query(operator, { appName: "shop", branch: "feature-x" })).total).toBe(21);
    expect((await query(operator, { appName: "shop", branch: "no-lines-yet" })).total).toBe(21);
    expect((await query(tenant("acme"), { appName: "shop", branch: "main" })).total).toBe(21);
    // The group scope still holds.
    expect((await query(tenant("globex"), { appName: "shop", branch: "main" })).total).toBe(0);
  });

  it("pages with limit and offset, and says has_more", async () => {
    const pages: string[] = [];
    for (let offset = 0; ; offset += 5) {
      const r = await query(operator, { appName: "shop", limit: 5, offset });
      expect(r.total).toBe(21);
      pages.push(...r.logs.map((l) => l.message));
      expect(r.hasMore).toBe(offset + r.logs.length < 21);
      if (!r.hasMore) break;
    }
    expect(pages).toEqual(shopOneHour);
    expect(await query(operator, { appName: "shop", offset: 50 })).toMatchObject({ logs: [], total: 21, hasMore: false });
    expect((await query(operator, { appName: "shop", limit: 1 })).logs).toHaveLength(1);
    expect((await query(operator, { appName: "shop", limit: 1000 })).logs).toHaveLength(21);
    for (const bad of [{ limit: 0 }, { limit: 1001 }, { offset: -1 }]) {
      expect(await refusal(query(operator, { appName: "shop", ...bad })), JSON.stringify(bad)).toMatchObject({ status: 422 });
    }
  });

  it("stops counting past 10 000 and keeps has_more exact", async () => {
    const now = Date.now();
    const flood = Array.from({ length: 10_050 }, (_, i) => ({
      line_id: randomUUID(),
      ts: new Date(now - 60_000 + i).toISOString(),
      source: "container" as const,
      level: "info" as const,
      app_name: "flood",
      branch: "main",
      group_slug: "acme",
      service_name: "web",
      deployment_id: null,
      build_id: null,
      action_id: null,
      instance_id: "host-1",
      message: `flood line ${i}`,
      metadata: {},
    }));
    expect(await service.store.insert(flood)).toEqual({ stored: 10_050, forgotten: 0 });
    expect(await query(operator, { appName: "flood" })).toMatchObject({ total: 10_001, hasMore: true });
    const tail = await query(operator, { appName: "flood", offset: 10_000, limit: 100 });
    expect(tail).toMatchObject({ total: 10_050, hasMore: false });
    expect(tail.logs).toHaveLength(50);
    expect(tail.logs.at(-1)!.message).toBe("flood line 0");
  });
});

// The agent's lines of one deploy that failed its health checks (ids as above).
const KIOSK_DEPLOY = "de0de0de-0000-4000-8000-000000000003";
const KIOSK_ACTION = "acacacac-0000-4000-8000-000000000003";
const KIOSK_EARLIER_DEPLOY = "de0de0de-0000-4000-8000-000000000004";

describe("the agent's lines: source semantics and why a container answer is empty", () => {
  const kiosk = { app_name: "kiosk", group_slug: "initech", branch: "main" };
  const replica = (stream: "stdout" | "stderr") => ({ replica: 1, stream, colour: "blue", tag: "main-1a2b" });
  const deployOf = { deployment_id: KIOSK_DEPLOY, action_id: KIOSK_ACTION };
  const webFirstSeen = ago(19 * MIN);
  const webLastSeen = ago(17.5 * MIN);
  const workerSeen = ago(3 * HOUR);

  beforeAll(async () => {
    const crash = "Error: cannot find module ./server.js";
    const lines: LogLineInput[] = [
      { ...kiosk, ...deployOf, ts: ago(20 * MIN), source: "deploy", service_name: "web", message: "deploy phase pulling image kiosk-web:main-1a2b" },
      // Container lines carry the deployment that started their replica.
      { ...kiosk, deployment_id: KIOSK_DEPLOY, ts: webFirstSeen, source: "container", service_name: "web", metadata: replica("stdout"), message: "kiosk listening on :3000" },
      { ...kiosk, ...deployOf, ts: ago(18 * MIN), source: "deploy", service_name: "web", message: "deploy phase health checks for web" },
      // The replica's own output, shipped by the collector; the agent ships the same crash tail
      // again as a deploy error line.
      { ...kiosk, deployment_id: KIOSK_DEPLOY, ts: webLastSeen, source: "container", level: "error", service_name: "web", metadata: replica("stderr"), message: crash },
      { ...kiosk, ...deployOf, ts: ago(17 * MIN), source: "deploy", level: "error", service_name: "web", message: crash },
      { ...kiosk, deployment_id: KIOSK_DEPLOY, ts: ago(16.5 * MIN), source: "agent", service_name: "web", message: "rolled back kiosk web to the previous release" },
      // Supervisor events: no deployment.
      { ...kiosk, ts: ago(16 * MIN), source: "agent", level: "warning", service_name: "web", message: "replica kiosk-web-1 crashed (exit 1); restarting" },
      { ...kiosk, ts: ago(15 * MIN), source: "agent", service_name: "web", message: "replica kiosk-web-1 restarted" },
      { ...kiosk, branch: "preview", ts: ago(4 * MIN), source: "agent", message: "preview branch registered" },
      { ...kiosk, deployment_id: KIOSK_EARLIER_DEPLOY, ts: workerSeen, source: "container", service_name: "worker", metadata: replica("stdout"), message: "worker drained the queue" },
      // An app with deploy and agent lines only: nothing of it ever ran.
      { app_name: "ghost", group_slug: "initech", branch: "main", ts: ago(10 * MIN), source: "deploy", service_name: "web", message: "deploy phase queued for ghost" },
      { app_name: "ghost", group_slug: "initech", branch: "main", ts: ago(9 * MIN), source: "agent", service_name: "web", message: "ghost supervisor idle" },
    ];
    await shipAndWait(lines, "app_name in ('kiosk', 'ghost')", []);
  });

  const sourced = async (q: Query) => (await query(operator, q)).logs.map((l) => [l.source, l.message]);

  it("reads deploy as deploy lines plus agent lines of a deployment, never supervisor events", async () => {
    expect(await sourced({ appName: "kiosk", source: "deploy" })).toEqual([
      ["agent", "rolled back kiosk web to the previous release"],
      ["deploy", "Error: cannot find module ./server.js"],
      ["deploy", "deploy phase health checks for web"],
      ["deploy", "deploy phase pulling image kiosk-web:main-1a2b"],
    ]);
    expect((await query(operator, { deploymentId: KIOSK_DEPLOY, source: "deploy" })).total).toBe(4);
  });

  it("reads agent as exactly the agent's lines, with or without a deployment", async () => {
    expect(await sourced({ appName: "kiosk", source: "agent" })).toEqual([
      ["agent", "preview branch registered"],
      ["agent", "replica kiosk-web-1 restarted"],
      ["agent", "replica kiosk-web-1 crashed (exit 1); restarting"],
      ["agent", "rolled back kiosk web to the previous release"],
    ]);
  });

  it("reads container as the collector's stdout and stderr, the crash tail once, without reason", async () => {
    const r = await query(operator, { appName: "kiosk", source: "container" });
    expect(r.logs.map((l) => [l.message, JSON.parse(l.metadataJson).stream])).toEqual([
      ["Error: cannot find module ./server.js", "stderr"],
      ["kiosk listening on :3000", "stdout"],
    ]);
    expect(r).toMatchObject({ total: 2, hasMore: false });
    expect(r.logs.every((l) => l.source === "container" && l.serviceName === "web" && l.instanceId === "host-1")).toBe(true);
    expect(r.reason).toBeUndefined();
    expect(r.error).toBeUndefined();
    const older = await query(operator, { appName: "kiosk", source: "container", since: "4h" });
    expect(older.logs.map((l) => l.message)).toEqual(["Error: cannot find module ./server.js", "kiosk listening on :3000", "worker drained the queue"]);
    expect(older.reason).toBeUndefined();
    // A page past the end of a match is not an empty result.
    const pastTheEnd = await query(operator, { appName: "kiosk", source: "container", offset: 10 });
    expect(pastTheEnd).toMatchObject({ logs: [], total: 2, hasMore: false });
    expect(pastTheEnd.reason).toBeUndefined();
    // A deployment id selects the output of the replicas it started, as it does without a source:
    // narrowing to container lines never widens the answer.
    const byDeployment = await query(operator, { deploymentId: KIOSK_DEPLOY, source: "container", since: "4h" });
    expect(byDeployment.logs.map((l) => l.message)).toEqual(["Error: cannot find module ./server.js", "kiosk listening on :3000"]);
    const unsourced = await query(operator, { deploymentId: KIOSK_DEPLOY, since: "4h" });
    expect(unsourced.logs.filter((l) => l.source === "container")).toEqual(byDeployment.logs);
    // A container line carries no action id: one names its app (spec 4.6), as app_name does.
    const byAction = await query(operator, { actionId: KIOSK_ACTION, source: "container", since: "4h" });
    expect(byAction.logs.map((l) => l.message)).toEqual(older.logs.map((l) => l.message));
    expect(await query(tenant("acme"), { deploymentId: KIOSK_DEPLOY, source: "container" })).toMatchObject({ logs: [], total: 0, reason: "no_log_group" });
  });

  it("keeps a log group per app, branch and service from the container lines ingested", async () => {
    const rows = await db.query<{ app_name: string; branch: string; service_name: string; group_slug: string; first_seen: Date; last_seen: Date }>(
      "select app_name, branch, service_name, group_slug, first_seen, last_seen from log_groups where app_name in ('kiosk', 'ghost') order by service_name",
    );
    expect(rows.rows.map((g) => [g.app_name, g.branch, g.service_name, g.group_slug])).toEqual([
      ["kiosk", "main", "web", "initech"],
      ["kiosk", "main", "worker", "initech"],
    ]);
    const [web, worker] = rows.rows;
    expect(web!.first_seen.toISOString()).toBe(webFirstSeen);
    // last_seen moves at most once a minute; the lines may have come in more than one batch.
    expect(Date.parse(webLastSeen) - web!.last_seen.getTime()).toBeLessThanOrEqual(MIN);
    expect(web!.last_seen.getTime()).toBeLessThanOrEqual(Date.parse(webLastSeen));
    expect([worker!.first_seen.toISOString(), worker!.last_seen.toISOString()]).toEqual([workerSeen, workerSeen]);
  });

  it("keeps one log group for the container lines that name no branch or service", async () => {
    const line = (minutes: number): LogLineInput => ({ ts: ago(minutes * MIN), source: "container", app_name: "bare", group_slug: "initech", message: `bare line ${minutes}` });
    await shipAndWait([line(30), line(20)], "app_name = $1", ["bare"]);
    await shipAndWait([line(40), line(10)], "app_name = $1", ["bare"], 4);
    const rows = await db.query<{ first_seen: Date; last_seen: Date }>("select first_seen, last_seen from log_groups where app_name = 'bare'");
    expect(rows.rows).toHaveLength(1);
    expect(Date.now() - rows.rows[0]!.first_seen.getTime()).toBeGreaterThanOrEqual(40 * MIN);
    expect(Date.now() - rows.rows[0]!.last_seen.getTime()).toBeLessThan(11 * MIN);
    expect(await query(operator, { appName: "bare", source: "container", since: "5m" })).toMatchObject({ total: 0, reason: "no_output_yet" });
  });

  it("says no_log_group when no container line was ever stored for the app, service and branch", async () => {
    const empty = { logs: [], total: 0, hasMore: false, reason: "no_log_group" };
    expect(await query(operator, { appName: "ghost", source: "container", since: "365d" })).toMatchObject(empty);
    expect(await query(operator, { appName: "no-such-app", source: "container" })).toMatchObject(empty);
    expect(await query(operator, { appName: "kiosk", serviceName: "cron", source: "container", since: "365d" })).toMatchObject(empty);
    // The app's lines are read (branch does not filter them); when the branch has no log group,
    // nothing was ever deployed on it.
    expect(await query(operator, { appName: "kiosk", branch: "preview", source: "container", since: "10m" })).toMatchObject(empty);
    // Another group's app reads like an unknown one, and a caller in no group sees no app.
    expect(await query(tenant("acme"), { appName: "kiosk", source: "container" })).toMatchObject(empty);
    const stray = makeCaller({ kind: "api_key", principalId: "k", scope: "read", visibleGroups: ["acme"], selectedGroup: "initech" });
    expect(await query(stray, { appName: "kiosk", source: "container" })).toMatchObject(empty);
    // An id names its app: container lines never carry one, and nothing else knows this id.
    expect(await query(operator, { deploymentId: "ffffffff-0000-4000-8000-000000000000", source: "container" })).toMatchObject(empty);
  });

  it("says no_output_yet when the log group exists but nothing matches the window or filters", async () => {
    const empty = { logs: [], total: 0, hasMore: false, reason: "no_output_yet" };
    expect(await query(operator, { appName: "kiosk", source: "container", since: "10m" })).toMatchObject(empty);
    expect(await query(operator, { appName: "kiosk", serviceName: "worker", source: "container" })).toMatchObject(empty);
    expect(await query(operator, { appName: "kiosk", branch: "main", source: "container", since: "10m" })).toMatchObject(empty);
    expect(await query(operator, { appName: "kiosk", source: "container", level: "warning" })).toMatchObject(empty);
    expect(await query(operator, { appName: "kiosk", source: "container", search: "segfault" })).toMatchObject(empty);
    expect(await query(tenant("initech"), { appName: "kiosk", source: "container", since: "10m" })).toMatchObject(empty);
    expect(await query(tenant("initech"), { source: "container", since: "10m" })).toMatchObject(empty);
    // The deployment's app was deployed; it printed nothing in the last 10 minutes.
    expect(await query(operator, { deploymentId: KIOSK_DEPLOY, source: "container", since: "10m" })).toMatchObject(empty);
  });

  it("has a log group for a service a deploy started that never printed: no_output_yet, not no_log_group", async () => {
    const quiet = { app_name: "quiet", group_slug: "initech", branch: "main", service_name: "web", source: "deploy" as const };
    await shipAndWait(
      [
        // Queued and set up: nothing started yet, so no stream either.
        { ...quiet, ts: ago(3 * MIN), metadata: { phase: "setup" }, message: "Deploying quiet:main-1 (1 service(s))" },
        { ...quiet, app_name: "hushed", ts: ago(3 * MIN), metadata: { phase: "setup" }, message: "Deploying hushed:main-1 (1 service(s))" },
        { ...quiet, ts: ago(2 * MIN), metadata: { phase: "start" }, message: "Started replica 1 (blue) on port 40001" },
      ],
      "app_name in ('quiet', 'hushed')",
      [],
      3,
    );
    expect(await query(operator, { appName: "quiet", source: "container" })).toMatchObject({ logs: [], total: 0, reason: "no_output_yet" });
    expect(await query(operator, { appName: "hushed", source: "container" })).toMatchObject({ logs: [], total: 0, reason: "no_log_group" });
  });

  it("gives no reason to an empty answer of any other source", async () => {
    for (const source of ["agent", "deploy", "build", "backup", ""]) {
      const r = await query(operator, { appName: "ghost", source, since: "1m" });
      expect(r, source).toMatchObject({ logs: [], total: 0 });
      expect(r.reason, source).toBeUndefined();
    }
  });
});

describe("a renamed or deleted group", () => {
  /** Publishes one of identity's group events, as its outbox relay would. */
  async function announce(subject: string, data: Record<string, unknown>) {
    const id = randomUUID();
    await bus.js.publish(bus.subject(subject), JSON.stringify({ id, data }), { msgID: id });
  }
  const rowsOf = async (slug: string) => {
    const counts: Record<string, number> = {};
    for (const table of ["log_lines", "log_builds", "log_groups"]) {
      counts[table] = (await db.query<{ n: number }>(`select count(*)::int as n from ${table} where group_slug = $1`, [slug])).rows[0]!.n;
    }
    return counts;
  };
  const lines = (group: string, app: string): LogLineInput[] => [
    { ts: ago(MIN), source: "container", app_name: app, group_slug: group, branch: "main", service_name: "web", message: `${app} says hello` },
    { ts: ago(MIN), source: "build", app_name: app, group_slug: group, branch: "main", build_id: randomUUID(), message: `${app} built` },
  ];

  it("moves the group's lines, and what ingestion keeps of them, to the new slug (group_renamed)", async () => {
    await shipAndWait([...lines("umbrella", "hive"), ...lines("tyrell", "nexus")], "app_name in ('hive', 'nexus')", [], 4);
    await announce(subjects.events.groupRenamed, { group_id: randomUUID(), slug: "umbrella-corp", previous_slug: "umbrella" });
    await until(async () => (await count("group_slug = $1", ["umbrella-corp"])) === 2, "lines under the new slug");
    expect(await rowsOf("umbrella-corp")).toEqual({ log_lines: 2, log_builds: 1, log_groups: 1 });
    expect(await rowsOf("umbrella")).toEqual({ log_lines: 0, log_builds: 0, log_groups: 0 });
    expect((await query(tenant("umbrella-corp"), { appName: "hive" })).total).toBe(2);
    expect((await query(tenant("umbrella"), { appName: "hive" })).total).toBe(0);
    expect((await query(tenant("tyrell"), { appName: "nexus" })).total).toBe(2);
  });

  it("stores a line still carrying the old slug, shipped after the rename, under the new one", async () => {
    await shipAndWait(lines("umbrella", "hive-late"), "app_name = 'hive-late'", []);
    expect(await count("app_name = 'hive-late' and group_slug = 'umbrella-corp'")).toBe(2);
    expect((await query(tenant("umbrella-corp"), { appName: "hive-late" })).total).toBe(2);
  });

  it("drops every line under any slug a deleted group had (group_deleted)", async () => {
    await shipAndWait(lines("umbrella", "hive-old"), "app_name = 'hive-old'", []);
    const deletedAt = new Date();
    await announce(subjects.events.groupDeleted, { group_id: randomUUID(), slugs: ["umbrella-corp", "umbrella"], deleted_at: deletedAt.toISOString() });
    await until(async () => (await count("group_slug in ('umbrella', 'umbrella-corp')")) === 0, "the deleted group's lines gone");
    expect(await rowsOf("umbrella-corp")).toEqual({ log_lines: 0, log_builds: 0, log_groups: 0 });
    expect(await rowsOf("tyrell")).toEqual({ log_lines: 2, log_builds: 1, log_groups: 1 });

    // Lines of the deleted group still on their way stay gone; a new group that takes one of its
    // slugs afterwards has its own lines.
    const before = service.ingestion.stats().forgotten;
    const late = (group: string, ts: string): LogLineInput => ({ ts, source: "container", app_name: "hive-zombie", group_slug: group, branch: "main", service_name: "web", message: `late under ${group}` });
    const later = new Date(deletedAt.getTime() + 1000).toISOString();
    await shipAndWait(
      [late("umbrella", ago(MIN)), late("umbrella-corp", ago(MIN)), late("umbrella", later)],
      "app_name = 'hive-zombie'",
      [],
      1,
    );
    await expect.poll(() => service.ingestion.stats().forgotten - before, { timeout: 15_000 }).toBe(2);
    expect((await db.query("select group_slug, ts from log_lines where app_name = 'hive-zombie'")).rows).toEqual([{ group_slug: "umbrella", ts: new Date(later) }]);
  });
});

describe("a group renamed twice, then back", () => {
  it("stores a late line under whichever slug the group has now", async () => {
    const rename = async (from: string, to: string) => {
      const id = randomUUID();
      await bus.js.publish(bus.subject(subjects.events.groupRenamed), JSON.stringify({ id, data: { group_id: "g-cyan", slug: to, previous_slug: from } }), { msgID: id });
      await until(async () => (await db.query("select 1 from log_group_renames where previous_slug = $1 and slug = $2", [from, to])).rowCount === 1, `${from} renamed ${to}`);
    };
    const late = (slug: string, app: string): LogLineInput => ({ ts: ago(MIN), source: "agent", app_name: app, group_slug: slug, message: `${app} under ${slug}` });
    await rename("cyan", "teal");
    await rename("teal", "turquoise");
    await shipAndWait([late("cyan", "chain-a"), late("teal", "chain-b")], "app_name like 'chain-%' and group_slug = 'turquoise'", [], 2);
    await rename("turquoise", "cyan");
    await shipAndWait([late("cyan", "chain-c"), late("teal", "chain-d"), late("turquoise", "chain-e")], "app_name like 'chain-%' and group_slug = 'cyan'", [], 5);
  });
});

describe("deleted builds", () => {
  async function announce(data: Record<string, unknown>) {
    const id = randomUUID();
    await bus.js.publish(bus.subject(subjects.events.buildsDeleted), JSON.stringify({ id, data }), { msgID: id });
  }
  const builds = async (ids: string[]) => (await db.query<{ n: number }>("select count(*)::int as n from log_builds where build_id = any($1)", [ids])).rows[0]!.n;

  it("drops a purged build's lines, and every line of a deleted branch, nothing of another branch", async () => {
    const [purged, kept, other] = [randomUUID(), randomUUID(), randomUUID()];
    const line = (branch: string, source: LogLineInput["source"], build_id?: string): LogLineInput => ({
      ts: ago(MIN), source, app_name: "gone", group_slug: "acme", branch, build_id, service_name: build_id ? undefined : "web", message: `${branch} ${source} ${build_id ?? ""}`,
    });
    await shipAndWait(
      [line("feature", "build", purged), line("feature", "build", kept), line("feature", "container"), line("main", "build", other), line("main", "container")],
      "app_name = 'gone'",
      [],
      5,
    );
    await announce({ group_slug: "acme", app_name: "gone", branch: "feature", build_ids: [purged], branch_deleted: false });
    await until(async () => (await count("build_id = $1", [purged])) === 0, "the purged build's lines gone");
    expect(await builds([purged])).toBe(0);
    expect(await count("app_name = 'gone'")).toBe(4);

    const deletedAt = new Date();
    await announce({ group_slug: "acme", app_name: "gone", branch: "feature", build_ids: [kept], branch_deleted: true, deleted_at: deletedAt.toISOString() });
    await until(async () => (await count("app_name = 'gone' and branch = 'feature'")) === 0, "the deleted branch's lines gone");
    expect(await builds([kept, other])).toBe(1);
    expect(await count("app_name = 'gone' and branch = 'main'")).toBe(2);
    const logGroups = async () => (await db.query("select branch from log_groups where app_name = 'gone' order by branch")).rows.map((r) => r.branch);
    expect(await logGroups()).toEqual(["main"]);

    // Lines shipped late (the build's last lines, a redelivery) do not bring them back; the
    // branch registered again has its own lines, and so does the other branch.
    const before = service.ingestion.stats().forgotten;
    const again = { ...line("feature", "container"), ts: new Date(deletedAt.getTime() + 1000).toISOString(), message: "the branch again" };
    await shipAndWait(
      [line("main", "build", purged), line("feature", "build", kept), line("feature", "container"), again, line("main", "container")],
      "app_name = 'gone'",
      [],
      4,
    );
    await expect.poll(() => service.ingestion.stats().forgotten - before, { timeout: 15_000 }).toBe(3);
    expect(await count("build_id in ($1, $2)", [purged, kept])).toBe(0);
    expect(await builds([purged, kept])).toBe(0);
    expect(await count("app_name = 'gone' and branch = 'feature'")).toBe(1);
    expect(await logGroups()).toEqual(["feature", "main"]);
  });

  it("deletes the lines of a batch that was committing while the build was deleted", async () => {
    const build = randomUUID();
    // A batch that has taken its share of the lock and written its line, as ingestion does, but
    // not committed: it did not see the deletion, and the deletion cannot see its line yet.
    const batch = new pg.Client({ connectionString: databaseUrl, options: "-c search_path=health_aggregator" });
    await batch.connect();
    try {
      await batch.query("begin");
      await batch.query("select pg_advisory_xact_lock_shared(hashtext(current_schema() || '.log-forgetting'))");
      await batch.query("insert into log_lines (line_id, ts, source, level, app_name, group_slug, branch, build_id, message) values ($1, now(), 'build', 'info', 'racy', 'acme', 'main', $2, 'in flight')", [randomUUID(), build]);
      await announce({ group_slug: "acme", app_name: "racy", branch: "main", build_ids: [build], branch_deleted: false });
      const waiting = async () => (await db.query<{ n: number }>("select count(*)::int as n from pg_locks where locktype = 'advisory' and not granted")).rows[0]!.n;
      await until(async () => (await waiting()) > 0, "the deletion waiting for the batch");
      await batch.query("commit");
    } finally {
      await batch.end();
    }
    await until(async () => (await count("build_id = $1", [build])) === 0, "the batch's line deleted");
  });
});

describe("an unreachable store", () => {
  it("answers an empty page with an error, not a failure", async () => {
    const port = await freePort();
    const dead = new LogStore({ url: `postgres://postgres@127.0.0.1:${port}/nowhere`, schema: "health_aggregator", logger });
    try {
      const transport = createRouterTransport(routes(service.ctx, dead));
      const deadClient = createClient(HealthAggregatorService, transport);
      for (const source of ["", "container"]) {
        const r = await deadClient.queryLogs({ caller: operator, appName: "shop", source });
        expect(r, source).toMatchObject({ logs: [], total: 0, hasMore: false });
        expect(r.error, source).toMatch(/log store is unreachable/);
        // error, not a reason: the store, not the app, is why the answer is empty.
        expect(r.reason, source).toBeUndefined();
      }
    } finally {
      await dead.close();
    }
  });
});

describe("a store whose connection is killed in the middle of a batch", () => {
  it("fails that batch, not the process, and stores the next one", async () => {
    const store = new LogStore({ url: databaseUrl, schema: "health_aggregator", logger });
    const holder = new pg.Client({ connectionString: databaseUrl, options: "-c search_path=health_aggregator" });
    await holder.connect();
    try {
      const line = (message: string): StoredLine => ({
        line_id: randomUUID(), ts: new Date().toISOString(), source: "agent", level: "info", app_name: "severed", branch: null, group_slug: "acme",
        service_name: null, deployment_id: null, build_id: null, action_id: null, instance_id: null, message, metadata: {},
      });
      // The batch waits for the lock a forgetting holds, its transaction open, when Postgres ends it.
      await holder.query("begin");
      await holder.query("select pg_advisory_xact_lock(hashtext(current_schema() || '.log-forgetting'))");
      const cut = store.insert([line("cut off")]);
      const waiting = "select pid from pg_stat_activity where wait_event_type = 'Lock' and query like '%pg_advisory_xact_lock_shared%'";
      await until(async () => (await db.query(waiting)).rowCount! > 0, "the batch waiting for the lock");
      await db.query(`select pg_terminate_backend(pid) from (${waiting}) w`);
      await expect(cut).rejects.toThrow(/terminat/i);
      await holder.query("commit");
      expect(await store.insert([line("after the cut")])).toEqual({ stored: 1, forgotten: 0 });
      expect((await db.query("select message from log_lines where app_name = 'severed'")).rows).toEqual([{ message: "after the cut" }]);
    } finally {
      await holder.end();
      await store.close();
    }
  });
});

describe("retention", () => {
  it("deletes the lines older than the retention, a batch at a time, and the builds they were the last lines of", async () => {
    const ancient = { app_name: "ancient", group_slug: "acme", branch: "main" };
    const oldBuild = randomUUID();
    const recentBuild = randomUUID();
    const lines: LogLineInput[] = [
      { ...ancient, ts: ago(40 * DAY), source: "build", build_id: oldBuild, message: "build of forty days ago" },
      { ...ancient, ts: ago(40 * DAY - MIN), source: "build", build_id: oldBuild, message: "build of forty days ago finished" },
      { ...ancient, ts: ago(31 * DAY), source: "container", service_name: "web", message: "request of a month ago" },
      { ...ancient, ts: ago(29 * DAY), source: "container", service_name: "web", message: "request within the month" },
      { ...ancient, ts: ago(MIN), source: "build", build_id: recentBuild, message: "build of a minute ago" },
    ];
    await shipAndWait(lines, "app_name = 'ancient'", []);
    const deleted = await service.store.prune(logRetentionCutoff(new Date(), 30), 2);
    expect(deleted).toBeGreaterThanOrEqual(3);
    const left = await db.query<{ message: string }>("select message from log_lines where app_name = 'ancient' order by ts");
    expect(left.rows.map((r) => r.message)).toEqual(["request within the month", "build of a minute ago"]);
    const builds = await db.query<{ build_id: string }>("select build_id from log_builds where app_name = 'ancient'");
    expect(builds.rows.map((r) => r.build_id)).toEqual([recentBuild]);
    expect((await query(operator, { appName: "ancient", since: "52w" })).total).toBe(2);
  });

  it("forgets what was forgotten once the retention has passed, renames aside", async () => {
    const [oldBuild, newBuild] = [randomUUID(), randomUUID()];
    await db.query("insert into log_forgotten_builds (build_id, forgotten_at) values ($1, now() - interval '31 days'), ($2, now() - interval '29 days')", [oldBuild, newBuild]);
    await db.query("insert into log_forgotten_branches values ('acme', 'ancient', 'old', now() - interval '31 days'), ('acme', 'ancient', 'new', now())");
    await db.query("insert into log_forgotten_groups values ('wayne-old', now() - interval '31 days'), ('wayne-new', now())");
    await db.query("insert into log_group_renames values ('cyberdyne', 'skynet')");
    await service.store.prune(logRetentionCutoff(new Date(), 30));
    const left = async (sql: string) => (await db.query(sql)).rows.map((r) => Object.values(r)[0]);
    expect(await left(`select build_id from log_forgotten_builds where build_id in ('${oldBuild}', '${newBuild}')`)).toEqual([newBuild]);
    expect(await left("select branch from log_forgotten_branches where app_name = 'ancient'")).toEqual(["new"]);
    expect(await left("select slug from log_forgotten_groups where slug like 'wayne-%'")).toEqual(["wayne-new"]);
    expect(await left("select slug from log_group_renames where previous_slug = 'cyberdyne'")).toEqual(["skynet"]);
  });
});
