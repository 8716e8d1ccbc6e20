/**
 * The deployer on its own, with every part real: a host that did not build the image fetches it
 * from the fleet's image store (NATS), unpacks it, starts the fixture app as a process, checks its
 * health path and routes it through a real Caddy; undeploy with purge takes it all away again. A
 * branch deployed before its group was renamed stays the same app to redeploy and undeploy.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, expect, it } from "vitest";
import { execFile } from "node:child_process";
import http from "node:http";
import { cp, mkdtemp, readdir, readFile, rm, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { connectBus, type Bus } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { parseAppConfigYaml } from "@platform/app-config";
import { deleteBusStreams, freePorts, startCaddy, testNatsUrl, uniquePrefix, type StartedCaddy } from "@platform/testing";
import { Deployer, releaseDir, type DeployerDeps } from "../src/deployer.ts";
import { RELEASES_KEPT } from "../src/retention.ts";
import { HostState } from "../src/host-state.ts";
import { deleteImages, fetchImage, publishImage } from "../src/image-store.ts";
import { Mutex } from "../src/mutex.ts";
import type { RoutingDrift } from "../src/router-types.ts";
import { CaddyRouter } from "../src/router.ts";
import { ProcessDriver } from "../src/runtime/process.ts";
import { Supervisor } from "../src/supervisor.ts";
import { probeSandbox } from "../src/sandbox.ts";

const FIXTURE = path.resolve(import.meta.dirname, "../../test/fixtures/node-web");
/** Whether replicas here run in a Landlock domain that limits their binds to PORT (sandbox.ts). */
const sandbox = await probeSandbox({ uid: 61000, gid: 61000 });
const bindsLimited = sandbox.ok && sandbox.scope.length > 0;
const HOST = "node-web.t.localhost";
const TAG = "main-0123abcd";
const logger = createLogger({ service: "agent-deployer-test", level: "silent", pretty: false });
const prefix = uniquePrefix("tdeploy");

let bus: Bus;
let dir: string;
let caddy: StartedCaddy;
let ports: [number, number];
let driver: ProcessDriver;
let supervisor: Supervisor;
let deployer: Deployer;
let state: HostState;
let baseDeps: DeployerDeps;
const lines: string[] = [];
const reported: string[] = [];

function get(port: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path: "/", headers: { host: HOST }, agent: false }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
  });
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "agent-deployer-test-"));
  bus = await connectBus({ url: testNatsUrl(), name: "agent-deployer-test", prefix, logger });
  // Another host built the image: it is in the fleet's image store only.
  const archive = path.join(dir, "built.tar.gz");
  await promisify(execFile)("tar", ["-czf", archive, "-C", FIXTURE, "."]);
  await publishImage(bus, "node-web", TAG, archive);

  ports = (await freePorts(2)) as [number, number];
  const [adminPort, httpPort] = ports;
  caddy = await startCaddy({ adminPort, httpPort, dataDir: path.join(dir, "caddy"), log: () => undefined });
  const runDir = path.join(dir, "run");
  // As the agent runs replicas: sandboxed (where this machine can) as the tenant user.
  driver = new ProcessDriver({ runDir, logger, runAs: { uid: 61000, gid: 61000 } });
  supervisor = new Supervisor({ driver, onEvent: () => undefined, logger });
  state = new HostState(runDir);
  await state.load();
  const parsed = parseAppConfigYaml(await readFile(path.join(FIXTURE, "platform.yaml"), "utf8"));
  if (!parsed.ok) throw new Error("the fixture's config is invalid");
  const deps: DeployerDeps = {
    hostId: "host-2",
    runDir,
    imageDir: path.join(dir, "images"),
    driver,
    supervisor,
    router: new CaddyRouter({ adminUrl: caddy.adminUrl, listenPort: httpPort }),
    state,
    routingTableLock: new Mutex(),
    resolve: async (j) => ({ imageTag: j.image_tag ?? TAG, config: parsed.config as Record<string, unknown>, env: { GREETING: "hi" }, hosts: [HOST] }),
    fetchImage: (app, tag, file) => fetchImage(bus, app, tag, file),
    deleteImages: (app, tags) => deleteImages(bus, app, tags),
    healthTimeoutMs: 30_000,
    drainMs: 100,
    stopGraceMs: 2_000,
    log: (line) => void lines.push(line.message),
    phase: async (name) => {
      reported.push(name);
      return false;
    },
  };
  baseDeps = deps;
  deployer = new Deployer(deps);
  // As the agent does when it starts: the router holds this host's (empty) table.
  await deployer.reassertRoutes();
});

afterAll(async () => {
  await supervisor?.close();
  for (const r of driver?.list() ?? []) await driver.stop(r.spec.id, 1000).catch(() => undefined);
  await driver?.close();
  await caddy?.stop();
  await bus?.close();
  await deleteBusStreams(prefix);
  if (dir) await rm(dir, { recursive: true, force: true });
});

const job = { action_id: "2b0c4c43-5a48-4d4c-9d3f-0a3c8c1f6a10", action_type: "DEPLOY", app_name: "node-web", branch: "main", group_slug: "acme", image_tag: TAG };

/** A deployer whose releases run this platform.yaml (and `deps` over the test's own). */
function deployerFor(yaml: string, deps: Partial<DeployerDeps> = {}): Deployer {
  const parsed = parseAppConfigYaml(yaml);
  if (!parsed.ok) throw new Error(`the config is invalid: ${JSON.stringify(parsed.errors)}`);
  return new Deployer({ ...baseDeps, ...deps, resolve: async (j) => ({ imageTag: j.image_tag ?? TAG, config: parsed.config as Record<string, unknown>, env: {}, hosts: [HOST] }) });
}

it("fetches an image this host lacks, then runs and routes the release", async () => {
  const outcome = await deployer.deploy(job);
  expect(outcome).toMatchObject({ status: "completed", error_message: "", result: { previous_tag: null, env_vars_snapshot: { GREETING: "hi" } } });
  // Each is a status of the deployment the queue shows (ready: ready_to_deploy, spec 3.2).
  expect(reported).toEqual(["setup", "start", "health_check", "ready", "swap_committed", "drain"]);
  expect(lines).toContain(`Fetched image node-web:${TAG} from the fleet's image store`);
  expect(await stat(path.join(dir, "images", "node-web", `${TAG}.tar.gz`))).toBeTruthy();
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("routes new replicas only once their ports are closed to the outside", async () => {
  const handedOut: number[] = [];
  let guarded: () => void = () => undefined;
  const guarding = new Promise<void>((resolve) => (guarded = resolve));
  const seen: string[] = [];
  const guardedDeployer = new Deployer({
    ...baseDeps,
    replicaPort: async () => {
      const [port] = await freePorts(1);
      handedOut.push(port!);
      return port!;
    },
    portsGuarded: () => guarding,
    phase: async (name) => {
      seen.push(name);
      return false;
    },
  });
  const deploying = guardedDeployer.deploy({ ...job, action_id: randomUUID() });
  await expect.poll(() => seen, { timeout: 30_000 }).toContain("ready");
  await new Promise((r) => setTimeout(r, 300));
  expect(seen).not.toContain("swap_committed");
  guarded();
  expect(await deploying).toMatchObject({ status: "completed" });
  expect(handedOut).toHaveLength(1);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("runs a release whose tree this host's build kept, with no image anywhere to fetch", async () => {
  const kept = "main-89abcdef";
  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", kept), { recursive: true });
  lines.length = 0;
  const outcome = await deployer.deploy({ ...job, action_id: "0e1d2c3b-4a59-4687-9a1b-2c3d4e5f6a7b", image_tag: kept });
  expect(outcome).toMatchObject({ status: "completed", result: { previous_tag: TAG } });
  expect(lines.some((l) => l.startsWith("Fetched image"))).toBe(false);
  await expect(stat(path.join(dir, "images", "node-web", `${kept}.tar.gz`))).rejects.toThrow(/ENOENT/);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("undeploys with purge: unrouted, stopped, the image gone here and from the fleet's store", async () => {
  const outcome = await deployer.undeploy({ ...job, action_type: "UNDEPLOY", purge: true, purge_tags: [TAG] });
  expect(outcome.status).toBe("completed");
  expect((await get(caddy.httpPort)).status).toBe(404);
  expect(driver.list().filter((r) => r.running)).toEqual([]);
  await expect(stat(path.join(dir, "images", "node-web", `${TAG}.tar.gz`))).rejects.toThrow(/ENOENT/);
  await expect(fetchImage(bus, "node-web", TAG, path.join(dir, "again.tar.gz"))).rejects.toThrow(/has no image/);
});

it("rolls forward past the swap commit when Caddy restarted empty: the whole table is asserted again", async () => {
  await caddy.stop();
  caddy = await startCaddy({ adminPort: ports[0], httpPort: ports[1], dataDir: path.join(dir, "caddy"), log: () => undefined });
  await publishImage(bus, "node-web", "main-4567cdef", path.join(dir, "built.tar.gz"));
  lines.length = 0;
  const outcome = await deployer.deploy({ ...job, action_id: "7c9e6679-7425-40de-944b-e07fc1f90ae7", image_tag: "main-4567cdef" });
  expect(outcome.status).toBe("completed");
  expect(lines.some((l) => l.startsWith("The route did not switch"))).toBe(true);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

/** A deployer whose deploy ends, with `why`, once its swap is committed and its route flipped: drain never runs. */
function stoppedBeforeDrain(why: string): Deployer {
  return new Deployer({
    ...baseDeps,
    phase: async (name) => {
      if (name === "drain") throw new Error(why);
      return false;
    },
  });
}

it("resumed after the agent stopped while draining, stops the colour that served before, even for the same tag", async () => {
  const before = state.appOf("node-web", "main")!;
  const oldReplicas = Object.values(before.services).flatMap((s) => s.replicas.map((r) => r.id));
  const redeploy = { ...job, action_id: "5b3f0c2e-8d41-4c7a-9e26-1a2b3c4d5e6f", image_tag: before.tag };
  // The agent "stops" right after the swap commit and the flip: drain never runs.
  expect((await stoppedBeforeDrain("the agent was stopped").deploy(redeploy)).status).toBe("failed");
  expect(state.appOf("node-web", "main")!.colour).not.toBe(before.colour);
  expect(driver.list().filter((r) => r.running).map((r) => r.spec.id)).toEqual(expect.arrayContaining(oldReplicas));

  // Claimed again after the restart: the deploy is finished, the old colour drained.
  const resumed = await deployer.deploy(redeploy);
  expect(resumed.status).toBe("completed");
  // The phases the stopped agent went through are still the deploy's, with how it was resumed.
  const phases = resumed.result.phases as Record<string, string>;
  expect(Object.keys(phases)).toEqual(["setup", "start", "health_check", "ready", "swap_committed", "drain", "resume"]);
  expect(phases.start).toContain("Started replica 1");
  expect(phases.resume).toContain("after the swap commit: the deploy was finished");
  // It reports what it ran with, as an uninterrupted deploy does (the history's env_vars_snapshot), and the tag it replaced.
  expect(resumed.result).toMatchObject({ env_vars_snapshot: { GREETING: "hi" }, previous_tag: before.tag });
  expect(state.inflight(redeploy.action_id)).toBeUndefined();
  const running = driver.list().filter((r) => r.running).map((r) => r.spec.id);
  expect(running).toHaveLength(1);
  expect(running.some((id) => oldReplicas.includes(id))).toBe(false);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("settles a deploy an earlier action left past its swap commit before it deploys the branch again", async () => {
  const before = state.appOf("node-web", "main")!;
  const left = { ...job, action_id: "6c2d1e0f-9b8a-4c7d-8e6f-5a4b3c2d1e0f", image_tag: before.tag };
  expect((await stoppedBeforeDrain("the route flip gave up").deploy(left)).status).toBe("failed");
  expect(state.inflight(left.action_id)).toBeDefined();

  // The next deploy of the branch, same tag: its new colour is the one the old replicas still hold.
  lines.length = 0;
  const next = await deployer.deploy({ ...job, action_id: "7d3e2f10-0c9b-4d8e-9f70-6b5c4d3e2f10", image_tag: before.tag });
  expect(next.status).toBe("completed");
  expect(lines).toContain(`Deploy ${left.action_id} was left unfinished, after the swap commit: the deploy was finished`);
  expect(state.allInflight()).toEqual([]);
  expect(driver.list().filter((r) => r.running)).toHaveLength(1);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

/**
 * A deployer that stops (as the agent would) once its swap commit is written, before the queue has
 * answered: the answer never comes, and nothing after it runs.
 */
function stoppedAtSwapCommit(): Deployer {
  return new Deployer({ ...baseDeps, phase: (name) => (name === "swap_committed" ? new Promise<boolean>(() => undefined) : Promise.resolve(false)) });
}

async function swapCommitWritten(actionId: string): Promise<void> {
  await expect.poll(() => state.inflight(actionId)?.swapCommitted, { timeout: 30_000 }).toBe(true);
}

it("resumed after the agent stopped between writing its swap commit and the queue's answer, asks the queue again and finishes", async () => {
  const before = state.appOf("node-web", "main")!;
  const redeploy = { ...job, action_id: "8e4f3a21-1d0c-4e9f-a081-7c6d5e4f3a21", image_tag: before.tag };
  void stoppedAtSwapCommit().deploy(redeploy);
  await swapCommitWritten(redeploy.action_id);
  expect(state.appOf("node-web", "main")!.colour).toBe(before.colour);

  reported.length = 0;
  const resumed = await deployer.deploy(redeploy);
  expect(resumed.status).toBe("completed");
  expect(reported).toEqual(["swap_committed"]);
  expect(state.appOf("node-web", "main")!.colour).not.toBe(before.colour);
  expect(state.allInflight()).toEqual([]);
  expect(driver.list().filter((r) => r.running)).toHaveLength(1);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("resumed there when the queue took a cancel meanwhile, stops the new colour: the running version keeps serving", async () => {
  const before = state.appOf("node-web", "main")!;
  const serving = Object.values(before.services).flatMap((s) => s.replicas.map((r) => r.id));
  const redeploy = { ...job, action_id: "9f5a4b32-2e1d-4fa0-b192-8d7e6f5a4b32", image_tag: before.tag };
  void stoppedAtSwapCommit().deploy(redeploy);
  await swapCommitWritten(redeploy.action_id);

  lines.length = 0;
  const cancelled = await new Deployer({ ...baseDeps, phase: async (name) => name === "swap_committed" }).deploy(redeploy);
  expect(cancelled).toMatchObject({ status: "cancelled", error_message: "Cancelled before the swap." });
  expect(lines).toContain(`The agent restarted during the deploy, and the deploy was cancelled before the swap: the new colour was stopped; ${before.tag} kept serving.`);
  expect(state.appOf("node-web", "main")).toMatchObject({ colour: before.colour, tag: before.tag });
  expect(state.allInflight()).toEqual([]);
  expect(driver.list().filter((r) => r.running).map((r) => r.spec.id)).toEqual(serving);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("keeps a branch deployed before its group was renamed as the same app: relabelled, swapped by a redeploy, stopped by an undeploy", async () => {
  const before = state.appOf("node-web", "main")!;
  expect(before).toMatchObject({ key: "acme/node-web/main", group: "acme" });
  expect(await state.relabelGroup("acme", "acme-co")).toBe(1);
  expect(state.appOf("node-web", "main")).toMatchObject({ key: "acme/node-web/main", group: "acme-co" });
  expect(Object.values(state.appOf("node-web", "main")!.services).flatMap((s) => s.replicas.map((r) => r.group))).toEqual(["acme-co"]);

  const renamed = { ...job, group_slug: "acme-co" };
  const redeploy = await deployer.deploy({ ...renamed, action_id: "0d7d5e4a-9a39-4a55-8a53-3f6f1e8c2b11", image_tag: "main-4567cdef" });
  expect(redeploy).toMatchObject({ status: "completed", result: { previous_tag: "main-4567cdef" } });
  expect(state.apps().map((a) => [a.key, a.group, a.colour])).toEqual([["acme/node-web/main", "acme-co", before.colour === "blue" ? "green" : "blue"]]);
  expect(driver.list().filter((r) => r.running)).toHaveLength(1);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });

  expect((await deployer.undeploy({ ...renamed, action_type: "UNDEPLOY" })).status).toBe("completed");
  expect(state.apps()).toEqual([]);
  expect(driver.list().filter((r) => r.running)).toEqual([]);
  expect((await get(caddy.httpPort)).status).toBe(404);
});

it("a drift check running through deploys' route flips and an undeploy finds no drift: it never undoes what they wrote", async () => {
  // The runtime host's check: another Deployer on the same host state, router and lock.
  const keeper = new Deployer(baseDeps);
  const found: Array<RoutingDrift | null> = [];
  let deploying = true;
  const checks = (async () => {
    while (deploying) found.push(await keeper.restoreDriftedRoutes());
  })();
  try {
    const colours: string[] = [];
    for (const action_id of ["1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e", "3c4d5e6f-7a8b-4c9d-8e1f-2a3b4c5d6e7f"]) {
      expect((await deployer.deploy({ ...job, action_id, image_tag: "main-4567cdef" })).status).toBe("completed");
      expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
      colours.push(state.appOf("node-web", "main")!.colour);
    }
    expect(colours).toEqual(["blue", "green", "blue"]);
    expect((await deployer.undeploy({ ...job, action_type: "UNDEPLOY" })).status).toBe("completed");
    expect((await get(caddy.httpPort)).status).toBe(404);
  } finally {
    deploying = false;
    await checks;
  }
  expect(found.length).toBeGreaterThan(20);
  expect(found.filter((drift) => drift !== null)).toEqual([]);
});

it("a deploy naming some services swaps only those: the others keep running their release, and a later full deploy replaces them all", async () => {
  const twoServices = deployerFor(
    "type: container\nservices:\n  web:\n    run: node server.js\n    port: 8080\n    health: /healthz\n    mount: /\n  worker:\n    run: node -e \"setInterval(() => {}, 1000)\"\n    background: true\n",
  );
  const running = () => driver.list().filter((r) => r.running).map((r) => r.spec);
  const ids = (service: string) => running().filter((r) => r.service === service).map((r) => r.id);
  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", "main-2222aaaa"), { recursive: true });

  expect((await twoServices.deploy({ ...job, action_id: "4d5e6f7a-8b9c-4d0e-9f1a-2b3c4d5e6f7a", image_tag: "main-4567cdef" })).status).toBe("completed");
  const [web1, worker1] = [ids("web"), ids("worker")];
  expect([web1.length, worker1.length]).toEqual([1, 1]);

  lines.length = 0;
  const subset = await twoServices.deploy({ ...job, action_id: "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", image_tag: "main-2222aaaa", services: ["web"] });
  expect(subset).toMatchObject({ status: "completed", result: { services: { web: { replicas: 1 }, worker: { replicas: 1 } } } });
  expect(lines).toContain("Deploying node-web:main-2222aaaa (1 service(s)) on host-2; worker keeps running main-4567cdef");
  expect(ids("worker")).toEqual(worker1);
  expect(ids("web")).toHaveLength(1);
  expect(ids("web")).not.toEqual(web1);
  expect(running().find((r) => r.service === "worker")).toMatchObject({ tag: "main-4567cdef" });
  expect(Object.keys(state.appOf("node-web", "main")!.services).sort()).toEqual(["web", "worker"]);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });

  // Every service again, with the tag the worker still runs, in the colour it still has.
  const full = await twoServices.deploy({ ...job, action_id: "6f7a8b9c-0d1e-4f2a-9b3c-4d5e6f7a8b9c", image_tag: "main-4567cdef" });
  expect(full.status).toBe("completed");
  expect(ids("web")).toHaveLength(1);
  expect(ids("worker")).toHaveLength(1);
  expect(ids("worker")).not.toEqual(worker1);
  expect(running().every((r) => r.tag === "main-4567cdef")).toBe(true);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });

  expect((await twoServices.undeploy({ ...job, action_type: "UNDEPLOY" })).status).toBe("completed");
  expect(running()).toEqual([]);
});

it("undeploys while the router does not answer: the replicas stop, and the routing check removes the front door once it answers", async () => {
  expect((await deployer.deploy({ ...job, action_id: "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d", image_tag: "main-4567cdef" })).status).toBe("completed");
  const router = baseDeps.router;
  const stalled = new Deployer({ ...baseDeps, router: Object.assign(Object.create(router) as typeof router, { remove: async () => Promise.reject(new Error("Caddy admin API timed out")) }) });
  lines.length = 0;
  expect((await stalled.undeploy({ ...job, action_type: "UNDEPLOY" })).status).toBe("completed");
  expect(lines[0]).toMatch(/^The router did not remove the front door \(Caddy admin API timed out\); it is removed when the router answers again$/);
  expect(state.apps()).toEqual([]);
  expect(driver.list().filter((r) => r.running)).toEqual([]);
  expect((await get(caddy.httpPort)).status).toBe(502);

  expect(await deployer.restoreDriftedRoutes()).toMatchObject({ extra: ["acme/node-web/main"] });
  expect((await get(caddy.httpPort)).status).toBe(404);
});

it("a flip to private reconciled while a deploy waits for its swap holds at once, and past that deploy's swap", async () => {
  let hosts = [HOST];
  const resolve: DeployerDeps["resolve"] = async (j) => ({ ...(await baseDeps.resolve(j)), hosts });
  let swap!: () => void;
  const swapAllowed = new Promise<void>((r) => (swap = r));
  let ready!: () => void;
  const atReady = new Promise<void>((r) => (ready = r));
  const held = new Deployer({
    ...baseDeps,
    resolve,
    phase: async (name) => {
      if (name === "ready") {
        ready();
        await swapAllowed;
      }
      return false;
    },
  });
  const reconciler = new Deployer({ ...baseDeps, resolve });
  expect((await reconciler.deploy({ ...job, action_id: "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f", image_tag: "main-4567cdef" })).status).toBe("completed");
  expect((await get(caddy.httpPort)).status).toBe(200);

  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", "main-5678def0"), { recursive: true });
  const deploying = held.deploy({ ...job, action_id: "6d7e8f9a-0b1c-4d2e-9f3a-4b5c6d7e8f9a", image_tag: "main-5678def0" });
  await atReady;
  hosts = [];
  const reconcile = { ...job, action_id: "7e8f9a0b-1c2d-4e3f-8a4b-5c6d7e8f9a0b", action_type: "RECONCILE_ROUTING", image_tag: null };
  expect(await reconciler.reconcile(reconcile)).toMatchObject({ status: "completed", result: { phases: { reconcile: "Private: the public route was removed" } } });
  expect((await get(caddy.httpPort)).status).toBe(404);
  swap();
  expect((await deploying).status).toBe("completed");
  expect(state.appOf("node-web", "main")).toMatchObject({ tag: "main-5678def0", hosts: [] });
  expect((await get(caddy.httpPort)).status).toBe(404);

  hosts = [HOST];
  expect(await reconciler.reconcile({ ...reconcile, action_id: "8f9a0b1c-2d3e-4f4a-9b5c-6d7e8f9a0b1c" })).toMatchObject({ status: "completed" });
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
});

it("keeps a branch's newest releases and the one it runs: each deploy removes the older ones from the host", async () => {
  const branch = path.dirname(releaseDir(path.join(dir, "run"), "acme", "node-web", "retained", "any"));
  const tags = ["main-aaaa0001", "main-aaaa0002", "main-aaaa0003", "main-aaaa0004", "main-aaaa0005"];
  for (const [i, tag] of tags.entries()) {
    await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "retained", tag), { recursive: true });
    lines.length = 0;
    const outcome = await deployer.deploy({ ...job, branch: "retained", action_id: `7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0${i}`, image_tag: tag });
    expect(outcome.status).toBe("completed");
    await new Promise((r) => setTimeout(r, 20));
  }
  expect(lines).toContain(`Removed 1 older release(s) of the branch from this host (${tags[1]})`);
  expect((await readdir(branch)).sort()).toEqual(tags.slice(-RELEASES_KEPT));
  expect(state.appOf("node-web", "retained")).toMatchObject({ tag: tags.at(-1) });
  expect((await deployer.undeploy({ ...job, branch: "retained", action_type: "UNDEPLOY" })).status).toBe("completed");
});

it("rolls forward past the swap commit when the router never answers: completed with a deploy warning, and routed once it answers", async () => {
  const branch = { ...job, branch: "unrouted", image_tag: "main-4567cdef" };
  expect((await deployer.deploy({ ...branch, action_id: "8b9c0d1e-2f3a-4b4c-9d5e-6f7a8b9c0d1e" })).status).toBe("completed");
  const before = state.appOf("node-web", "unrouted")!;
  const silent = new Deployer({
    ...baseDeps,
    routeDeadlineMs: 1_500,
    // The router goes away as the swap is committed, and stays away past the deadline.
    phase: async (name) => {
      if (name === "swap_committed") await caddy.stop();
      return false;
    },
  });
  lines.length = 0;
  const outcome = await silent.deploy({ ...branch, action_id: "9c0d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f" });
  expect(outcome).toMatchObject({ status: "completed", error_message: "", result: { deploy_warnings: [expect.stringMatching(/^The router did not answer for 2 s after the swap commit/)] } });
  const after = state.appOf("node-web", "unrouted")!;
  expect(after.colour).not.toBe(before.colour);
  expect(driver.list().filter((r) => r.running && r.spec.colour === before.colour && r.spec.branch === "unrouted")).toEqual([]);
  // The router back (empty, as after a restart): the routing check gives it the table, new colour included.
  caddy = await startCaddy({ adminPort: ports[0], httpPort: ports[1], dataDir: path.join(dir, "caddy"), log: () => undefined });
  await deployer.reassertRoutes();
  // Read on a connection of its own: Caddy closes the admin connections a config load used.
  const routes = await new Promise<string>((resolve, reject) => {
    http.get(`${caddy.adminUrl}/config/apps/http/servers/platform/routes`, { agent: false }, (res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c));
      res.on("end", () => resolve(body));
    }).on("error", reject);
  });
  const [port] = Object.values(after.services).flatMap((s) => s.replicas.map((r) => r.port));
  expect(routes).toContain(`127.0.0.1:${port}`);
  expect((await deployer.undeploy({ ...branch, action_type: "UNDEPLOY" })).status).toBe("completed");
});

it("fails a deploy whose health check never passes with what the health path last answered, and the running version keeps serving", async () => {
  expect((await deployer.deploy({ ...job, action_id: "0d1e2f3a-4b5c-4d6e-9f7a-8b9c0d1e2f3a", image_tag: "main-4567cdef" })).status).toBe("completed");
  const failing = (run: string) => deployerFor(`type: container\nservices:\n  web:\n    run: ${run}\n    port: 8080\n    health: /healthz\n`, { healthTimeoutMs: 2_500 });
  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", "main-3333bbbb"), { recursive: true });

  const unhealthy = failing(`node -e "require('node:http').createServer((q, s) => { s.statusCode = 503; s.end() }).listen(process.env.PORT)"`);
  expect(await unhealthy.deploy({ ...job, action_id: "1e2f3a4b-5c6d-4e7f-8a9b-0c1d2e3f4a5b", image_tag: "main-3333bbbb" })).toMatchObject({
    status: "failed",
    error_message: "Service web did not pass its health check within 3 s: the last GET /healthz answered 503.",
  });
  // Listening on a port of its own, not PORT: the sandbox refuses the bind where it can, and the health check finds nothing on PORT where it cannot.
  const elsewhere = failing(`node -e "require('node:http').createServer((q, s) => s.end()).listen(0)"`);
  expect(await elsewhere.deploy({ ...job, action_id: "2f3a4b5c-6d7e-4f8a-9b0c-1d2e3f4a5b6c", image_tag: "main-3333bbbb" })).toMatchObject({
    status: "failed",
    error_message: bindsLimited
      ? "Service web exited with code 1 during the health checks. A replica may listen only on its PORT; binding another port was refused."
      : "Service web did not pass its health check within 3 s: the last GET /healthz found nothing listening on the service's PORT.",
  });
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
  expect((await deployer.undeploy({ ...job, action_type: "UNDEPLOY" })).status).toBe("completed");
});

/** GETs `/` through the router until `done()`, counting the answers by status. */
async function requestLoop(done: () => boolean): Promise<Map<number, number>> {
  const statuses = new Map<number, number>();
  while (!done()) {
    const status = await get(caddy.httpPort).then((r) => r.status, () => 0);
    statuses.set(status, (statuses.get(status) ?? 0) + 1);
  }
  return statuses;
}

it("restarts a service one replica at a time with no failed request, even a lone replica; a second stop says nothing ran", async () => {
  const withReplicas = (n: number) => deployerFor(`type: container\nservices:\n  web:\n    run: node server.js\n    port: 8080\n    health: /healthz\n    mount: /\n    replicas: ${n}\n`);
  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", "main-4444cccc"), { recursive: true });
  for (const n of [2, 1]) {
    const d = withReplicas(n);
    expect((await d.deploy({ ...job, action_id: randomUUID(), image_tag: "main-4444cccc" })).status).toBe("completed");
    const before = driver.list().filter((r) => r.running && r.spec.service === "web").map((r) => r.handle);
    expect(before).toHaveLength(n);
    lines.length = 0;
    let restarting = true;
    const loop = requestLoop(() => !restarting);
    const restart = await d.serviceAction({ ...job, action_id: randomUUID(), action_type: "SERVICE_ACTION", service_name: "web", action: "restart" });
    restarting = false;
    expect(restart).toMatchObject({ status: "completed", error_message: "" });
    const statuses = await loop;
    expect([...statuses.keys()], JSON.stringify([...statuses])).toEqual([200]);
    expect(lines.filter((l) => l.startsWith("Restarted replica"))).toEqual(Array.from({ length: n }, (_, i) => `Restarted replica ${i + 1}`));
    const after = driver.list().filter((r) => r.running && r.spec.service === "web").map((r) => r.handle);
    expect(after).toHaveLength(n);
    expect(after.some((handle) => before.includes(handle))).toBe(false);
  }

  const d = withReplicas(1);
  const stop = () => d.serviceAction({ ...job, action_id: randomUUID(), action_type: "SERVICE_ACTION", service_name: "web", action: "stop" });
  expect((await stop()).result.phases).toEqual({ stop: "Stopped 1 replica(s)" });
  expect((await stop()).result.phases).toEqual({ stop: "No replica was running" });
  expect((await get(caddy.httpPort)).status).toBe(503);
  expect((await deployer.undeploy({ ...job, action_type: "UNDEPLOY" })).status).toBe("completed");
});

it("fails a deploy whose background worker exits a second after it started, and the running release keeps its workers", async () => {
  const withWorker = (worker: string) =>
    deployerFor(`type: container\nservices:\n  web:\n    run: node server.js\n    port: 8080\n    health: /healthz\n    mount: /\n  worker:\n    run: ${worker}\n    background: true\n`);
  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", "main-5555dddd"), { recursive: true });
  await cp(FIXTURE, releaseDir(path.join(dir, "run"), "acme", "node-web", "main", "main-6666eeee"), { recursive: true });
  expect((await withWorker(`node -e "setInterval(() => {}, 1000)"`).deploy({ ...job, action_id: randomUUID(), image_tag: "main-5555dddd" })).status).toBe("completed");
  const workers = () => driver.list().filter((r) => r.running && r.spec.service === "worker").map((r) => r.spec.tag);
  expect(workers()).toEqual(["main-5555dddd"]);

  const late = withWorker(`node -e "console.log('connecting'); setTimeout(() => process.exit(4), 1500)"`);
  const outcome = await late.deploy({ ...job, action_id: randomUUID(), image_tag: "main-6666eeee" });
  expect(outcome).toMatchObject({ status: "failed", error_message: "Service worker exited with code 4 during the health checks." });
  expect(workers()).toEqual(["main-5555dddd"]);
  expect(await get(caddy.httpPort)).toEqual({ status: 200, body: "hello from node-web (/)\n" });
  expect((await deployer.undeploy({ ...job, action_type: "UNDEPLOY" })).status).toBe("completed");
});
