/**
 * The agent's work lane against the real deploy-queue (Postgres, NATS JetStream, Connect): an
 * action that throws is completed as failed once, never run again by a redelivery; a completion
 * the queue could not take is sent again, not the action run again; every waiting action is
 * tried, so the queue's gates choose what runs (priority, admit-force); an action held back by
 * one this agent claims or runs is claimed as soon as that one ends.
 */
import { randomUUID } from "node:crypto";
import { afterAll, afterEach, beforeAll, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { deployQueueEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { DeployQueueService } from "@platform/proto";
import { connectBus, subjects, type Bus } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createTestDatabase, deleteBusStreams, dropDatabase, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build as buildDeployQueue } from "../../services/deploy-queue/src/app.ts";
import { Action, Agent } from "../../services/deploy-queue/src/entities/index.ts";
import { startWorkLane, type WorkLane, type WorkOptions } from "../src/work.ts";
import type { DeployJob, DeployOutcome } from "../src/deployer.ts";

const logger = createLogger({ service: "agent-work-test", level: "silent", pretty: false });
const HOST = "h-work";

let databaseUrl: string;
let prefix: string;
let queueService: RunningService;
let queue: ReturnType<typeof createServiceClient<typeof DeployQueueService>>;
let bus: Bus;
let lane: WorkLane | undefined;

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix("twork");
  queueService = await buildDeployQueue(
    loadConfig(deployQueueEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent" }),
  );
  queue = createServiceClient(DeployQueueService, `http://127.0.0.1:${queueService.rpc.port}`);
  bus = await connectBus({ url: testNatsUrl(), name: "agent-work-test", prefix, logger });
});

afterEach(async () => {
  await lane?.stop();
  lane = undefined;
});

afterAll(async () => {
  await bus?.close();
  await queueService?.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

const row = (id: string) => queueService.ctx.read((em) => em.findOneOrFail(Action, { id }));

/** A build this host has built, and its DEPLOY waiting for an agent: what the lane will take up. */
async function builtAndQueued(app?: string): Promise<string> {
  const buildId = randomUUID();
  const deployId = randomUUID();
  app ??= `app-${buildId.slice(0, 8)}`;
  const data = {
    build_id: buildId,
    deploy_action_id: deployId,
    app_name: app,
    branch: "main",
    group_slug: "acme",
    tag: `main-${buildId.slice(0, 8)}`,
    repository: "file:///srv/git/app.git",
    config_path: "platform.yaml",
    auto_deploy: true,
    created_by: "api_key:k",
  };
  await bus.js.publish(bus.subject(subjects.events.buildRequested), JSON.stringify({ id: randomUUID(), data }), { msgID: randomUUID() });
  await expect.poll(() => queueService.ctx.read((em) => em.count(Action, { id: { $in: [buildId, deployId] } })), { timeout: 10_000 }).toBe(2);
  expect((await queue.claimAction({ actionId: buildId, hostId: HOST })).claimed).toBe(true);
  await queue.completeAction({ actionId: buildId, hostId: HOST, status: "completed", resultJson: "{}" });
  return deployId;
}

function startLane(deploy: (job: DeployJob) => Promise<DeployOutcome>, overrides: Partial<WorkOptions> = {}): Promise<WorkLane> {
  // Only DEPLOY reaches this lane's deployer here; the BUILD was finished above.
  const deployer = (() => ({ deploy })) as unknown as WorkOptions["deployer"];
  return startWorkLane({ bus, hostId: HOST, queue, logger, log: () => undefined, build: {} as WorkOptions["build"], deployer, ...overrides });
}

it("completes an action that throws as failed, once: the redelivered message does not run it again", async () => {
  const deployId = await builtAndQueued();
  let runs = 0;
  lane = await startLane(async () => {
    runs++;
    throw new Error("the disk is full");
  });
  await expect.poll(async () => (await row(deployId)).status, { timeout: 15_000 }).toBe("failed");
  expect((await row(deployId)).errorMessage).toBe(`The agent on host ${HOST} failed while running the action: the disk is full`);
  // Long enough for a nak'd message to come back (1 s) and be claimed again.
  await new Promise((r) => setTimeout(r, 2500));
  expect(runs).toBe(1);
});

it("sends a completion the queue could not take again, without running the action again", async () => {
  const deployId = await builtAndQueued();
  let runs = 0;
  let refusals = 2;
  const flaky = {
    ...queue,
    completeAction: (req: Parameters<typeof queue.completeAction>[0]) => {
      if (refusals > 0) {
        refusals--;
        return Promise.reject(new ConnectError("deploy-queue is restarting", Code.Unavailable));
      }
      return queue.completeAction(req);
    },
  } as typeof queue;
  lane = await startLane(
    async () => {
      runs++;
      return { status: "completed", error_message: "", result: {} };
    },
    { queue: flaky },
  );
  await expect.poll(async () => (await row(deployId)).status, { timeout: 15_000 }).toBe("completed");
  expect(refusals).toBe(0);
  expect(runs).toBe(1);
});

it("tries every waiting action, so a prioritized one takes the next slot and an admit-forced one runs past the limit", async () => {
  // A live agent on this host: the work goes to its own subject, where the queue order applies.
  bus.nc.publish(bus.subject(subjects.heartbeat(HOST)), JSON.stringify({ host_id: HOST, version: "0.1.0", schedulable: true, cpus: 2 }));
  await expect.poll(() => queueService.ctx.read((em) => em.findOne(Agent, { hostId: HOST })), { timeout: 5000 }).toBeTruthy();
  const deploys = [await builtAndQueued(), await builtAndQueued(), await builtAndQueued(), await builtAndQueued()];
  const started: string[] = [];
  const finish = new Map<string, () => void>();
  lane = await startLane(
    (job) =>
      new Promise<DeployOutcome>((resolve) => {
        started.push(job.action_id);
        finish.set(job.action_id, () => resolve({ status: "completed", error_message: "", result: {} }));
      }),
  );
  const sql = (query: string, params: unknown[]) => queueService.ctx.write((em) => em.getConnection().execute(query, params, "run", em.getTransactionContext()));
  try {
    // Two DEPLOYs at once on a host (which two depends on whose claim came first); the other two
    // are tried meanwhile, and refused.
    await expect.poll(() => started.length, { timeout: 15_000 }).toBe(2);
    const [older, newer] = deploys.filter((id) => !started.includes(id));
    await expect.poll(async () => (await row(newer!)).admissionCheckReason ?? "", { timeout: 10_000 }).toMatch(/at its limit/);
    // The newer of the two waiting is prioritized: it takes the next slot, ahead of the older.
    await sql("update deploy_queue.actions set priority = 1 where id = ?", [newer]);
    finish.get(started[0]!)!();
    await expect.poll(() => started.includes(newer!), { timeout: 15_000 }).toBe(true);
    expect(started.includes(older!)).toBe(false);

    // Past the limit once, with an override.
    await sql("update deploy_queue.actions set admit_force_until = now() + interval '1 minute' where id = ?", [older]);
    await expect.poll(() => started.includes(older!), { timeout: 15_000 }).toBe(true);
    expect((await row(older!)).admitForceUsed).toBe(true);
  } finally {
    for (const done of finish.values()) done();
  }
  for (const id of deploys) await expect.poll(async () => (await row(id)).status, { timeout: 15_000 }).toBe("completed");
});

it("claims an action held back by one whose claim this agent still awaits as soon as that one ends, not after the redelivery delay", async () => {
  const app = `app-${randomUUID().slice(0, 8)}`;
  const first = await builtAndQueued(app);
  const second = await builtAndQueued(app);
  // The first deploy's claim is answered late: the second's refusal, naming it, comes back first.
  const secondAnswers: Array<{ claimed: boolean; blockingActionId: string }> = [];
  const slow = {
    ...queue,
    claimAction: async (req: Parameters<typeof queue.claimAction>[0]) => {
      const answer = await queue.claimAction(req);
      if (req.actionId === first) await new Promise((r) => setTimeout(r, 500));
      if (req.actionId === second) secondAnswers.push({ claimed: answer.claimed, blockingActionId: answer.blockingActionId });
      return answer;
    },
  } as typeof queue;
  lane = await startLane(async () => ({ status: "completed", error_message: "", result: {} }), { queue: slow });
  await expect.poll(async () => (await row(second)).status, { timeout: 15_000 }).toBe("completed");
  const [a, b] = [await row(first), await row(second)];
  expect(a.status).toBe("completed");
  expect(secondAnswers[0]).toEqual({ claimed: false, blockingActionId: first });
  // A refusal sent back to the bus would be tried again only after 2 s.
  expect(b.claimedAt!.getTime() - a.completedAt!.getTime()).toBeLessThan(1000);
});

it("settles what this host holds of a deploy the queue ended while it was away, when the redelivered message is the one told so", async () => {
  const deployId = await builtAndQueued();
  // Claimed by this host before it went away; the queue then ended it (its reaper, say).
  expect((await queue.claimAction({ actionId: deployId, hostId: HOST })).claimed).toBe(true);
  await queue.completeAction({ actionId: deployId, hostId: HOST, status: "completed", resultJson: "{}" });
  const abandoned: string[] = [];
  let runs = 0;
  const deployer = (() => ({
    deploy: async () => {
      runs++;
      return { status: "completed", error_message: "", result: {} };
    },
    abandon: async (id: string) => void abandoned.push(id),
  })) as unknown as WorkOptions["deployer"];
  // The agent's start took nothing up (its resume lost the race): the message alone hears "dropped".
  lane = await startWorkLane({ bus, hostId: HOST, queue, logger, log: () => undefined, build: {} as WorkOptions["build"], deployer, resumable: () => [] });
  await expect.poll(() => abandoned, { timeout: 15_000 }).toContain(deployId);
  expect(runs).toBe(0);
});
