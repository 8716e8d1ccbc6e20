/**
 * The runtime host with a real Caddy: at agent start the whole routing table this host's state
 * holds is asserted, even when Caddy still serves a table (one an agent killed mid-change left);
 * afterwards the table is asserted again whenever Caddy's drifts from that record.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import http from "node:http";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { connectBus, type Bus } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { deleteBusStreams, freePorts, startCaddy, testNatsUrl, uniquePrefix, type StartedCaddy } from "@platform/testing";
import { HostState, routeOf, type DeployedApp } from "../src/host-state.ts";
import { CaddyRouter, NO_REPLICA_BODY, routeId } from "../src/router.ts";
import { startRuntimeHost, type RuntimeHostOptions } from "../src/runtime-host.ts";
import type { LogLineInput } from "@platform/logship";
import { ProcessDriver } from "../src/runtime/process.ts";
import type { ReplicaSpec } from "../src/runtime/types.ts";

const logger = createLogger({ service: "agent-runtime-host-test", level: "silent", pretty: false });
const prefix = uniquePrefix("trhost");
let dir: string;
let caddy: StartedCaddy;
let bus: Bus;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "agent-runtime-host-test-"));
  const [adminPort, httpPort] = (await freePorts(2)) as [number, number];
  caddy = await startCaddy({ adminPort, httpPort, dataDir: path.join(dir, "caddy"), log: () => undefined });
  bus = await connectBus({ url: testNatsUrl(), name: "agent-runtime-host-test", prefix, logger });
});

afterAll(async () => {
  await caddy?.stop();
  await bus?.close();
  await deleteBusStreams(prefix);
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Outside the kernel's ephemeral range, as the agent's default is. */
const REPLICA_PORTS = { first: 20000, last: 29999 };
const inRange = (p: number | null | undefined) => typeof p === "number" && p >= REPLICA_PORTS.first && p <= REPLICA_PORTS.last;

function hostOptions(runDir: string): RuntimeHostOptions {
  return {
    hostId: "host-1",
    runDir,
    imageDir: path.join(dir, "images"),
    runtime: "process",
    dockerSocket: "/nonexistent.sock",
    routerAdminUrl: caddy.adminUrl,
    routerPort: caddy.httpPort,
    hide: [],
    runAs: { uid: 61000, gid: 61000 },
    pidsMax: 1024,
    tenants: { name: "tenants", memoryMb: 0, pidsMax: 0 },
    replicaPortRange: REPLICA_PORTS,
    healthTimeoutMs: 10_000,
    logLinesPerMinute: 6000,
    apps: createServiceClient(AppsBuildsService, "http://127.0.0.1:9"),
    bus,
    logger,
    ship: () => undefined,
  };
}

it("asserts its whole routing table at start, replacing one Caddy still holds", async () => {
  const router = new CaddyRouter({ adminUrl: caddy.adminUrl, listenPort: caddy.httpPort });
  await router.assertAll([{ key: "g/stale/main", hosts: ["stale.dev.localhost"], mounts: [{ service: "web", path: "/", upstreams: ["127.0.0.1:9"] }] }]);
  expect(await router.current()).toEqual(["g/stale/main"]);

  // This host's state records nothing deployed: the stale front door must go.
  const host = await startRuntimeHost(hostOptions(path.join(dir, "run")));
  try {
    expect(await router.current()).toEqual([]);
  } finally {
    await host.close();
  }
});

const CHECK_MS = 50;
const HOST = "web.t.localhost";

/** How many requests Caddy's admin API answered with `method` on `prefix` (`/config/`, `/id/`), by its own metrics. */
async function adminRequests(method: string, prefix: string): Promise<number> {
  const metrics = await (await fetch(`${caddy.adminUrl}/metrics`)).text();
  let count = 0;
  for (const line of metrics.split("\n")) {
    if (line.startsWith("caddy_admin_http_requests_total{") && line.includes(`method="${method}"`) && line.includes(`path="${prefix}"`)) {
      count += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return count;
}

/** A change made by hand through Caddy's admin API, as an operator with curl would. */
async function byHand(method: string, urlPath: string, body?: unknown): Promise<void> {
  const res = await fetch(`${caddy.adminUrl}${urlPath}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  expect(res.status, await res.text()).toBe(200);
}

function served(): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port: caddy.httpPort, path: "/", headers: { host: HOST }, agent: false }, (res) => {
      let body = "";
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
  });
}

it("asserts the table again when a front door is deleted or changed by hand through Caddy's admin API, and only then", async () => {
  // A service stopped by a service action: its front door answers that no replica runs.
  const app: DeployedApp = {
    key: "g/web/main",
    group: "g",
    app: "web",
    branch: "main",
    tag: "main-1",
    colour: "blue",
    deploymentId: "d-1",
    hosts: [HOST],
    releaseDir: path.join(dir, "nowhere"),
    services: { web: { mount: "/", health: null, background: false, stopped: true, replicas: [] } },
    since: new Date().toISOString(),
  };
  const runDir = path.join(dir, "run-drift");
  const record = new HostState(runDir);
  await record.load();
  await record.setApp(app);
  const routes = [routeOf(app)];
  const router = new CaddyRouter({ adminUrl: caddy.adminUrl, listenPort: caddy.httpPort });
  const routerServes = () => expect.poll(() => router.drift(routes), { timeout: 3_000 }).toBeNull();
  const asserts = () => adminRequests("POST", "/config/");

  const host = await startRuntimeHost({ ...hostOptions(runDir), routerCheckMs: CHECK_MS });
  try {
    await routerServes();
    expect(await served()).toEqual({ status: 503, body: NO_REPLICA_BODY });

    // Nothing drifted: every check reads the table, none writes it.
    const atStart = await asserts();
    const reads = await adminRequests("GET", "/config/");
    await sleep(10 * CHECK_MS);
    expect(await adminRequests("GET", "/config/")).toBeGreaterThan(reads + 3);
    expect(await asserts()).toBe(atStart);

    await byHand("DELETE", `/id/${routeId(app.key)}`);
    await routerServes();
    await expect.poll(asserts).toBe(atStart + 1);
    expect(await served()).toEqual({ status: 503, body: NO_REPLICA_BODY });

    await byHand("PATCH", `/id/${routeId(app.key)}/handle/0/routes/0/handle`, [{ handler: "reverse_proxy", upstreams: [{ dial: "127.0.0.1:9" }] }]);
    await routerServes();
    await expect.poll(asserts).toBe(atStart + 2);
    expect(await served()).toEqual({ status: 503, body: NO_REPLICA_BODY });

    // Restored, the table is left alone again.
    await sleep(10 * CHECK_MS);
    expect(await asserts()).toBe(atStart + 2);
  } finally {
    await host.close();
  }
});

it("moves a crashed replica to another port of the replica range at once, and again when that one is taken before the restart; the route follows", async () => {
  const release = path.join(dir, "release-moved");
  await mkdir(release, { recursive: true });
  // Serves, and the first time also dies half a second in (a crash the supervisor restarts).
  await writeFile(
    path.join(release, "server.js"),
    `const fs = require("node:fs");
     const first = !fs.existsSync("crashed-once");
     if (first) fs.writeFileSync("crashed-once", "");
     require("node:http").createServer((req, res) => res.end("the replica")).listen(Number(process.env.PORT));
     if (first) setTimeout(() => process.exit(3), 500);`,
  );
  const [port] = (await freePorts(1)) as [number];
  const spec: ReplicaSpec = {
    // Its own id each run: a replica another run left behind keeps its cgroup of that name.
    id: `g.moved.main.web.blue.0.main-1.${uniquePrefix("d")}`,
    group: "g",
    app: "moved",
    branch: "main",
    service: "web",
    colour: "blue",
    index: 0,
    tag: "main-1",
    deploymentId: "d-2",
    releaseDir: release,
    command: `${process.execPath} server.js`,
    env: { PORT: String(port) },
    port,
    memoryMb: null,
  };
  const app: DeployedApp = {
    key: "g/moved/main",
    group: "g",
    app: "moved",
    branch: "main",
    tag: "main-1",
    colour: "blue",
    deploymentId: "d-2",
    hosts: [HOST],
    releaseDir: release,
    services: { web: { mount: "/", health: null, background: false, stopped: false, replicas: [spec] } },
    since: new Date().toISOString(),
  };
  const runDir = path.join(dir, "run-moved");
  const record = new HostState(runDir);
  await record.load();
  await record.setApp(app);
  const shipped: string[] = [];
  const host = await startRuntimeHost({ ...hostOptions(runDir), ship: (line) => void shipped.push(line.message) });
  const portNow = async () => {
    const now = new HostState(runDir);
    await now.load();
    return now.appOf("moved", "main")?.services.web?.replicas[0]?.port;
  };
  // Another process takes the port the replica is to come back on, before it does.
  const squatter = http.createServer((req, res) => res.end("the squatter"));
  try {
    await expect.poll(async () => (await served().catch(() => null))?.body, { timeout: 10_000 }).toBe("the replica");
    const next = await until(async () => {
      const p = await portNow();
      return typeof p === "number" && p !== port ? p : undefined;
    });
    await new Promise<void>((resolve, reject) => squatter.once("error", reject).listen(next, "127.0.0.1", () => resolve()));
    await expect.poll(() => shipped.find((m) => m.startsWith(`Port ${next} of replica ${spec.id} was taken`)), { timeout: 10_000 }).toBeTruthy();
    await expect.poll(async () => (await served().catch(() => null))?.body, { timeout: 10_000 }).toBe("the replica");
    expect([port, next]).not.toContain(await portNow());
    expect([next, await portNow()].every(inRange)).toBe(true);
    for (let i = 0; i < 5; i++) expect((await served()).body).toBe("the replica");
  } finally {
    await new Promise((r) => squatter.close(r));
    await host.close();
    await removeReplicas(runDir);
  }
});

it("ships a replica's output up to its log rate limit, and says in the replica's stream how many lines it dropped", async () => {
  const release = path.join(dir, "release-flood");
  await mkdir(release, { recursive: true });
  // 20 000 lines at once, then it stays up, quiet.
  await writeFile(
    path.join(release, "flood.js"),
    `let out = ""; for (let i = 0; i < 20000; i++) out += "line " + i + "\\n"; process.stdout.write(out); setInterval(() => {}, 60000);`,
  );
  const spec: ReplicaSpec = {
    id: `g.flood.main.worker.blue.0.main-1.${uniquePrefix("d")}`,
    group: "g",
    app: "flood",
    branch: "main",
    service: "worker",
    colour: "blue",
    index: 0,
    tag: "main-1",
    deploymentId: "d-3",
    releaseDir: release,
    command: `${process.execPath} flood.js`,
    env: {},
    port: null,
    memoryMb: null,
  };
  const runDir = path.join(dir, "run-flood");
  const record = new HostState(runDir);
  await record.load();
  await record.setApp({
    key: "g/flood/main",
    group: "g",
    app: "flood",
    branch: "main",
    tag: "main-1",
    colour: "blue",
    deploymentId: "d-3",
    hosts: [],
    releaseDir: release,
    services: { worker: { mount: null, health: null, background: true, stopped: false, replicas: [spec] } },
    since: new Date().toISOString(),
  });
  const shipped: LogLineInput[] = [];
  const host = await startRuntimeHost({ ...hostOptions(runDir), logLinesPerMinute: 600, ship: (line) => void shipped.push(line) });
  try {
    const output = () => shipped.filter((l) => l.source === "container" && l.metadata?.replica === spec.id);
    const notices = () => output().filter((l) => l.metadata?.event === "log_rate_limited");
    const dropped = () => notices().reduce((n, l) => n + Number(l.metadata?.dropped_lines), 0);
    await expect.poll(() => output().length - notices().length + dropped(), { timeout: 15_000 }).toBe(20_000);
    const lines = output().filter((l) => l.metadata?.event === undefined);
    // A minute's worth at once, and a few more as the allowance refills.
    expect(lines.length).toBeGreaterThanOrEqual(600);
    expect(lines.length).toBeLessThan(700);
    expect(lines.slice(0, 600).map((l) => l.message)).toEqual(Array.from({ length: 600 }, (_, i) => `line ${i}`));
    const [notice] = notices();
    expect(notice).toMatchObject({ level: "warning", app_name: "flood", service_name: "worker", deployment_id: "d-3" });
    expect(notice!.message).toMatch(/^\[\d+ line\(s\) of this replica's output dropped since \S+: a replica may log 600 lines a minute\]$/);
  } finally {
    await host.close();
    await removeReplicas(runDir);
  }
});

/** Replicas outlive the agent: a test's go with it. */
async function removeReplicas(runDir: string): Promise<void> {
  const cleaner = new ProcessDriver({ runDir });
  for (const r of await cleaner.adopt()) {
    await cleaner.stop(r.spec.id, 500);
    await cleaner.remove(r.spec.id);
  }
  await cleaner.close();
}

/** Polls `read` every 10 ms until it answers something. */
async function until<T>(read: () => Promise<T | undefined>, timeoutMs = 5_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (value !== undefined) return value;
    if (Date.now() > end) throw new Error("timed out");
    await sleep(10);
  }
}
