/**
 * The runtime host at agent start, with a real Caddy: the whole routing table this host's state
 * holds is asserted, even when Caddy still serves a table (one an agent killed mid-change left).
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { connectBus, type Bus } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { deleteBusStreams, freePorts, startCaddy, testNatsUrl, uniquePrefix, type StartedCaddy } from "@platform/testing";
import { CaddyRouter } from "../src/router.ts";
import { startRuntimeHost } from "../src/runtime-host.ts";

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

it("asserts its whole routing table at start, replacing one Caddy still holds", async () => {
  const router = new CaddyRouter({ adminUrl: caddy.adminUrl, listenPort: caddy.httpPort });
  await router.assertAll([{ key: "g/stale/main", hosts: ["stale.dev.localhost"], mounts: [{ service: "web", path: "/", upstreams: ["127.0.0.1:9"] }] }]);
  expect(await router.current()).toEqual(["g/stale/main"]);

  // This host's state records nothing deployed: the stale front door must go.
  const host = await startRuntimeHost({
    hostId: "host-1",
    runDir: path.join(dir, "run"),
    imageDir: path.join(dir, "images"),
    runtime: "process",
    dockerSocket: "/nonexistent.sock",
    routerAdminUrl: caddy.adminUrl,
    routerPort: caddy.httpPort,
    hide: [],
    healthTimeoutMs: 10_000,
    apps: createServiceClient(AppsBuildsService, "http://127.0.0.1:9"),
    bus,
    logger,
    ship: () => undefined,
  });
  try {
    expect(await router.current()).toEqual([]);
  } finally {
    await host.close();
  }
});
