/**
 * The agent answers GIT_PREFLIGHT over the machine's real NATS: on its own subject
 * `agent.rpc.<host_id>.git_preflight` and, in the queue group `agents`, on
 * `agent.rpc.any.git_preflight`, where exactly one of several agents answers.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { agentEnv, loadConfig } from "@platform/config";
import { createLogger } from "@platform/logger";
import { AGENT_RPC_WORKING_HEADER, connectBus, requestOfAgent, subjects, type Bus } from "@platform/bus";
import { deleteBusStreams, testNatsUrl, uniquePrefix } from "@platform/testing";
import { makeFixtureRepo, type FixtureRepo } from "../../test/fixtures/git.ts";
import { build, type Agent } from "../src/app.ts";
import { GIT_PREFLIGHT_OP, type GitPreflightReply } from "../src/preflight.ts";

const logger = createLogger({ service: "agent-test", level: "silent", pretty: false });
const prefixes: string[] = [];
const agents: Agent[] = [];
const clients: Bus[] = [];
let workDir: string;
let repo: FixtureRepo;

function startAgent(prefix: string, hostId: string, env: Record<string, string> = {}): Promise<Agent> {
  const config = loadConfig(agentEnv, {
    NATS_URL: testNatsUrl(),
    BUS_PREFIX: prefix,
    AGENT_HOST_ID: hostId,
    AGENT_HEALTH_PORT: "0",
    AGENT_WORK_DIR: workDir,
    PLATFORM_ENVIRONMENT: "dev",
    LOG_LEVEL: "silent",
    ...env,
  });
  return build(config, logger).then((agent) => {
    agents.push(agent);
    return agent;
  });
}

async function client(prefix: string): Promise<Bus> {
  const bus = await connectBus({ url: testNatsUrl(), name: "agent-rpc-test", prefix, logger });
  clients.push(bus);
  return bus;
}

async function request(bus: Bus, subject: string, body: unknown, raw = false): Promise<GitPreflightReply> {
  const reply = await requestOfAgent(bus.nc, bus.subject(subject), raw ? (body as string) : JSON.stringify(body), { timeoutMs: 45_000 });
  return reply.json<GitPreflightReply>();
}

const anySubject = subjects.agentRpcAny(GIT_PREFLIGHT_OP);

beforeAll(async () => {
  workDir = await mkdtemp(path.join(os.tmpdir(), "agent-rpc-test-"));
  repo = await makeFixtureRepo("node-web");
});

afterAll(async () => {
  for (const agent of agents) await agent.close().catch(() => undefined);
  for (const bus of clients) await bus.close();
  for (const prefix of prefixes) await deleteBusStreams(prefix);
  await repo?.cleanup();
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

describe("one agent", () => {
  const prefix = uniquePrefix("tagent");
  prefixes.push(prefix);
  const hostId = `host-${prefix}`;
  let agent: Agent;
  let bus: Bus;

  beforeAll(async () => {
    agent = await startAgent(prefix, hostId);
    bus = await client(prefix);
  });

  it("subscribes to its own and the any-agent subject, under the bus prefix", () => {
    expect(agent.rpcSubjects).toEqual([`${prefix}.agent.rpc.${hostId}.git_preflight`, `${prefix}.agent.rpc.any.git_preflight`]);
  });

  it("answers ready for node-web on agent.rpc.any.git_preflight", async () => {
    const reply = await request(bus, anySubject, { repository: repo.url, branch: "main", config_path: "platform.yaml" });
    expect(reply).toEqual({
      status: "ready",
      result: { reason: "ready", detail: expect.any(String), services: ["web"], missing_paths: [], errors: [] },
      commit: repo.head,
      config: expect.objectContaining({ services: { web: expect.objectContaining({ run: "node server.js" }) } }),
    });
  });

  it("answers ready on its host-specific subject, ignoring extra request fields", async () => {
    const reply = await request(bus, subjects.agentRpc(hostId, GIT_PREFLIGHT_OP), {
      app_id: "2b0c4c43-5a48-4d4c-9d3f-0a3c8c1f6a10",
      nonce: 3,
      repository: repo.url,
      branch: "main",
      config_path: "platform.yaml",
    });
    expect(reply).toMatchObject({ status: "ready", result: { services: ["web"] }, commit: repo.head });
  });

  it("answers a request that is not JSON instead of leaving it to time out", async () => {
    const reply = await request(bus, anySubject, "not json", true);
    expect(reply).toMatchObject({ status: "no_access", result: { reason: "invalid_request" } });
  });

  it("says it is working before it answers, so a requester can tell a live agent from a dead one", async () => {
    const replies = await bus.nc.requestMany(bus.subject(anySubject), JSON.stringify({ repository: repo.url, branch: "main", config_path: "platform.yaml" }), {
      strategy: "stall",
      stall: 10_000,
      maxWait: 10_000,
    });
    const seen: Array<{ working: boolean; body: string }> = [];
    for await (const m of replies) {
      seen.push({ working: m.headers?.has(AGENT_RPC_WORKING_HEADER) ?? false, body: m.string() });
      if (m.data.length > 0) break;
    }
    expect(seen[0]).toEqual({ working: true, body: "" });
    expect(seen.at(-1)!.working).toBe(false);
    expect(JSON.parse(seen.at(-1)!.body)).toMatchObject({ status: "ready" });
  });

  it("answers several requests at once", async () => {
    const replies = await Promise.all(
      Array.from({ length: 6 }, (_, i) => request(bus, anySubject, { repository: repo.url, branch: i % 2 ? "main" : "nope", config_path: "platform.yaml" })),
    );
    expect(replies.map((r) => r.status)).toEqual(["no_access", "ready", "no_access", "ready", "no_access", "ready"]);
  });

  it("stops answering once closed", async () => {
    await agent.close();
    agents.splice(agents.indexOf(agent), 1);
    await expect(requestOfAgent(bus.nc, bus.subject(subjects.agentRpc(hostId, GIT_PREFLIGHT_OP)), "{}", { timeoutMs: 5_000 })).rejects.toThrow(/no responders/i);
  });
});

describe("two agents on the same prefix", () => {
  const prefix = uniquePrefix("tagent");
  prefixes.push(prefix);
  let bus: Bus;

  beforeAll(async () => {
    await startAgent(prefix, `a-${prefix}`);
    await startAgent(prefix, `b-${prefix}`);
    bus = await client(prefix);
  });

  it("a request to any agent is answered exactly once", async () => {
    const inbox = bus.nc.subscribe(`_INBOX.${uniquePrefix("preflight")}.*`);
    const received = new Map<string, GitPreflightReply[]>();
    void (async () => {
      for await (const m of inbox) {
        // The agent's "working" messages before its answer are not answers.
        if (m.headers?.has(AGENT_RPC_WORKING_HEADER)) continue;
        const list = received.get(m.subject) ?? [];
        list.push(m.json<GitPreflightReply>());
        received.set(m.subject, list);
      }
    })();
    const base = inbox.getSubject().slice(0, -2);
    const body = JSON.stringify({ repository: repo.url, branch: "main", config_path: "platform.yaml" });
    const n = 8;
    for (let i = 0; i < n; i++) bus.nc.publish(bus.subject(anySubject), body, { reply: `${base}.${i}` });
    await bus.nc.flush();

    await expect.poll(() => received.size, { timeout: 45_000, interval: 100 }).toBe(n);
    // Give a second answer time to arrive, were there one.
    await new Promise((r) => setTimeout(r, 1_500));
    inbox.unsubscribe();
    for (let i = 0; i < n; i++) {
      const answers = received.get(`${base}.${i}`) ?? [];
      expect(answers, `request ${i}`).toHaveLength(1);
      expect(answers[0]?.status).toBe("ready");
    }
  });

  it("each agent also answers on its own subject", async () => {
    for (const host of [`a-${prefix}`, `b-${prefix}`]) {
      const reply = await request(bus, subjects.agentRpc(host, GIT_PREFLIGHT_OP), { repository: repo.url, branch: "main", config_path: "platform.yaml" });
      expect(reply.status, host).toBe("ready");
    }
  });
});

describe("an agent that cannot work", () => {
  const prefix = uniquePrefix("tagent");
  prefixes.push(prefix);

  it("answers no_access/agent_error rather than leaving the requester waiting", async () => {
    // AGENT_WORK_DIR below a regular file: the temporary clone cannot be made.
    const file = path.join(workDir, "not-a-directory");
    await writeFile(file, "");
    await startAgent(prefix, `broken-${prefix}`, { AGENT_WORK_DIR: path.join(file, "agent") });
    const bus = await client(prefix);
    const reply = await request(bus, anySubject, { repository: repo.url, branch: "main", config_path: "platform.yaml" });
    expect(reply).toEqual({
      status: "no_access",
      result: { reason: "agent_error", detail: expect.stringContaining("could not run the preflight"), services: [], missing_paths: [], errors: [] },
    });
  });

  it("refuses the reserved host id 'any'", async () => {
    await expect(startAgent(prefix, "any")).rejects.toThrow(/reserved/);
  });

  it("refuses file:// repositories outside dev unless PLATFORM_ALLOW_FILE_REPOS is set", async () => {
    const prod = uniquePrefix("tagent");
    prefixes.push(prod);
    await startAgent(prod, `prod-${prod}`, { PLATFORM_ENVIRONMENT: "production" });
    const bus = await client(prod);
    const refused = await request(bus, anySubject, { repository: repo.url, branch: "main", config_path: "platform.yaml" });
    expect(refused).toMatchObject({ status: "no_access", result: { reason: "file_repository_not_allowed" } });

    const allowed = uniquePrefix("tagent");
    prefixes.push(allowed);
    await startAgent(allowed, `prod-${allowed}`, { PLATFORM_ENVIRONMENT: "production", PLATFORM_ALLOW_FILE_REPOS: "true" });
    const bus2 = await client(allowed);
    const ready = await request(bus2, anySubject, { repository: repo.url, branch: "main", config_path: "platform.yaml" });
    expect(ready.status).toBe("ready");
  });
});
