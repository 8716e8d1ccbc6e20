/**
 * The preflight worker against the real Postgres and NATS, with a stand-in agent answering the
 * `git_preflight` request on NATS (the agent's own tests cover what a real agent answers): an
 * agent failure is asked again rather than recorded, a ready answer records the services and
 * the config as the base layer, how each preflight ended is told to the queue, and a request an
 * agent never answers holds up no other app's preflight.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { appsBuildsEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { makeCaller } from "@platform/caller";
import { connectBus, subjects, type Bus } from "@platform/bus";
import { createTestDatabase, deleteBusStreams, dropDatabase, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { startIdentity, type TestIdentity } from "./identity.ts";

let databaseUrl: string;
let prefix: string;
let identity: TestIdentity;
let service: RunningService;
let bus: Bus;
const requests: unknown[] = [];
/** `preflight_checked` events as published (a core subscription sees JetStream's messages too). */
const checked: Array<Record<string, unknown>> = [];
const acme = makeCaller({ kind: "api_key", principalId: "k-acme", scope: "deploy", visibleGroups: ["acme"], selectedGroup: "acme" });
const CONFIG = { type: "container", services: { web: { run: "node server.js", port: 8080, mount: "/" } } };

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  bus = await connectBus({ url: testNatsUrl(), name: "stand-in-agent", prefix });
  const sub = bus.nc.subscribe(bus.subject(subjects.agentRpcAny("git_preflight")));
  void (async () => {
    for await (const m of sub) {
      requests.push(m.json());
      // An agent that died holding the request: no answer, nor "working", ever comes.
      if (m.json<{ repository: string }>().repository.includes("lost-by-agent")) continue;
      // The first answer is the agent failing itself; the next ones read the repository.
      m.respond(
        JSON.stringify(
          requests.length === 1
            ? { status: "no_access", result: { reason: "agent_error", detail: "git is not installed", services: [], missing_paths: [], errors: [] } }
            : { status: "ready", result: { reason: "ready", detail: "valid", services: ["web"], missing_paths: [], errors: [] }, config: CONFIG },
        ),
      );
    }
  })();
  const checks = bus.nc.subscribe(bus.subject(subjects.events.preflightChecked));
  void (async () => {
    for await (const m of checks) checked.push(m.json<{ data: Record<string, unknown> }>().data);
  })();
  await bus.nc.flush();
  identity = await startIdentity({ databaseUrl, prefix, groups: ["acme"] });
  service = await build(
    loadConfig(appsBuildsEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent", IDENTITY_URL: identity.url }),
  );
});

afterAll(async () => {
  await service?.close();
  await identity?.service.close();
  await bus?.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

it("asks again after an agent failure, then records ready with the config as the base layer", async () => {
  const client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${service.rpc.port}`);
  await client.registerApp({ caller: acme, appName: "web", repository: "https://example.com/acme/web.git" });
  await expect.poll(async () => (await client.getApp({ caller: acme, appName: "web" })).preflightStatus, { timeout: 20_000 }).toBe("ready");
  expect(requests.length).toBeGreaterThanOrEqual(2);
  const layers = await client.getAppConfig({ caller: acme, appName: "web" });
  expect(layers.base).toEqual(CONFIG);
  const app = await client.getApp({ caller: acme, appName: "web" });
  expect(app.serviceNames).toEqual(["web"]);
  expect(app.services.map((s) => s.name)).toEqual(["web"]);
});

it("tells the queue how each preflight ended: answered, or replaced by a newer one before an agent was asked", async () => {
  const client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${service.rpc.port}`);
  const registered = await client.registerApp({ caller: acme, appName: "api", repository: "https://example.com/acme/api.git" });
  await expect.poll(() => checked.find((c) => c.action_id === registered.preflightActionId), { timeout: 20_000 }).toMatchObject({
    status: "completed",
    preflight_status: "ready",
    app_name: "api",
    branch: "main",
    group_slug: "acme",
    requested_by: "api_key:k-acme",
    message: "The repository check answered ready: valid.",
  });
  // A request the app has moved past (an older nonce) is not asked of an agent.
  const app = await client.getApp({ caller: acme, appName: "api" });
  const stale = { action_id: "0b5e2c4e-9a51-4f7e-8d0c-6a1f3e2b7c90", app_id: app.id, nonce: 0, repository: "https://example.com/acme/api.git", branch: "main", config_path: "platform.yaml", app_name: "api", group_slug: "acme", requested_by: "api_key:k-acme", requested_at: new Date().toISOString() };
  const asked = requests.length;
  await bus.js.publish(bus.subject(subjects.events.preflightRequested), JSON.stringify({ id: "6f1d2a3b-4c5d-4e6f-8a7b-9c0d1e2f3a4b", data: stale }));
  await expect.poll(() => checked.find((c) => c.action_id === stale.action_id), { timeout: 20_000 }).toMatchObject({
    status: "cancelled",
    preflight_status: null,
    message: "A newer preflight of the app replaced it before an agent was asked.",
  });
  expect(requests.length).toBe(asked);
});

it("answers other apps' preflights while one waits on an agent that never answers", async () => {
  const client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${service.rpc.port}`);
  await client.registerApp({ caller: acme, appName: "lost", repository: "https://example.com/acme/lost-by-agent.git" });
  await expect.poll(() => requests.some((r) => (r as { app_name: string }).app_name === "lost"), { timeout: 20_000 }).toBe(true);
  await client.registerApp({ caller: acme, appName: "after", repository: "https://example.com/acme/after.git" });
  await expect.poll(async () => (await client.getApp({ caller: acme, appName: "after" })).preflightStatus, { timeout: 20_000 }).toBe("ready");
  expect((await client.getApp({ caller: acme, appName: "lost" })).preflightStatus).toBe("pending");
});
