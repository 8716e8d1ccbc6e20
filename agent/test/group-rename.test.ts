/**
 * A group renamed while the agent was down: its durable consumer of identity's group_renamed
 * takes the event up when the agent is back, and what the host runs in that group is relabelled.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { randomUUID } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { agentEnv, loadConfig } from "@platform/config";
import { createLogger } from "@platform/logger";
import { connectBus, subjects, type Bus } from "@platform/bus";
import { deleteBusStreams, freePort, testNatsUrl, uniquePrefix } from "@platform/testing";
import { build } from "../src/app.ts";

const logger = createLogger({ service: "agent-rename-test", level: "silent", pretty: false });
const prefix = uniquePrefix("trename");
let dir: string;
let bus: Bus;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "agent-rename-test-"));
  bus = await connectBus({ url: testNatsUrl(), name: "agent-rename-test", prefix, logger });
});

afterAll(async () => {
  await bus?.close();
  await deleteBusStreams(prefix);
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function startAgent() {
  const config = loadConfig(agentEnv, {
    NATS_URL: testNatsUrl(),
    BUS_PREFIX: prefix,
    AGENT_HOST_ID: "host-rename",
    AGENT_HEALTH_PORT: "0",
    AGENT_WORK_DIR: path.join(dir, "work"),
    AGENT_RUN_DIR: path.join(dir, "run"),
    AGENT_IMAGE_DIR: path.join(dir, "images"),
    // No router here: the agent says so and goes on.
    AGENT_ROUTER_ADMIN_URL: `http://127.0.0.1:${await freePort()}`,
    PLATFORM_ENVIRONMENT: "dev",
    LOG_LEVEL: "silent",
  });
  return build(config, logger);
}

const groupsInState = async () => {
  const state = JSON.parse(await readFile(path.join(dir, "run", "state.json"), "utf8")) as { apps: Record<string, { group: string }> };
  return Object.values(state.apps).map((a) => a.group);
};

it("relabels what runs in a group renamed while the agent was down, once it is back", async () => {
  // An app of group `acme` deployed here (no replica to start: it declares no service).
  await mkdir(path.join(dir, "run"), { recursive: true });
  const app = { key: "acme/shop/main", group: "acme", app: "shop", branch: "main", tag: "main-1", colour: "blue", deploymentId: "d1", hosts: [], releaseDir: dir, services: {}, since: new Date().toISOString() };
  await writeFile(path.join(dir, "run", "state.json"), JSON.stringify({ apps: { [app.key]: app }, inflight: {} }));

  // The agent's first start makes its consumer; then it goes down.
  await (await startAgent()).close();
  await bus.js.publish(bus.subject(subjects.events.groupRenamed), JSON.stringify({ id: randomUUID(), data: { group_id: randomUUID(), previous_slug: "acme", slug: "acme-co" } }), {
    msgID: randomUUID(),
  });

  const agent = await startAgent();
  try {
    await expect.poll(groupsInState, { timeout: 10_000 }).toEqual(["acme-co"]);
  } finally {
    await agent.close();
  }
});
