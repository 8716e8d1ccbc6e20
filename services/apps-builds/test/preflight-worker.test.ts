/**
 * The preflight worker against the real Postgres and NATS, with a stand-in agent answering the
 * `git_preflight` request on NATS (the agent's own tests cover what a real agent answers): an
 * agent failure is asked again rather than recorded, and a ready answer records the services and
 * the config as the base layer.
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
