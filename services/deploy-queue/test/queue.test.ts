/**
 * deploy-queue against the real Postgres and NATS JetStream, through its Connect API: actions from
 * build_requested events, dispatch to agents, claims through the admission gates, progress,
 * completion, cancel, prioritize, admit-force, reads, stuck_class, pruning, and following a
 * group's rename or deletion.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deployQueueEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { DeployQueueService } from "@platform/proto";
import { inGroup, makeCaller } from "@platform/caller";
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream";
import { connectBus, subjects, subscribe, type Bus, type BuildRequested, type EventEnvelope } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createTestDatabase, deleteBusStreams, dropDatabase, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { Action, Agent, HistoryRecord } from "../src/entities/index.ts";
import { acceptBuildRequest } from "../src/domain/intake.ts";
import { redispatchFromSilentHosts } from "../src/domain/placement.ts";
import { pruneTerminal } from "../src/domain/pruning.ts";
import { recordHistory } from "../src/domain/history.ts";
import { BUILD_REQUESTED_DURABLE } from "../src/workers.ts";
import { currentSlugs, forgetGroup, rekeyGroup } from "../src/domain/groups.ts";

const logger = createLogger({ service: "deploy-queue-test", level: "silent", pretty: false });

let databaseUrl: string;
let prefix: string;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof DeployQueueService>>;
let bus: Bus;
const updates: EventEnvelope[] = [];

const caller = (group: string, scope = "deploy") => makeCaller({ kind: "api_key", principalId: `k-${group}-${scope}`, scope, visibleGroups: [group], selectedGroup: group });
const operator = (selectedGroup = "", explicitGroup = false) =>
  makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, platformRoot: true, selectedGroup, explicitGroup });
const acme = caller("acme");
const acmeAdmin = caller("acme", "admin");
const globex = caller("globex");
const globexAdmin = caller("globex", "admin");


let counter = 0;
function buildRequest(overrides: Partial<BuildRequested> = {}): BuildRequested {
  counter += 1;
  return {
    build_id: randomUUID(),
    deploy_action_id: randomUUID(),
    app_name: `app${counter}`,
    branch: "main",
    group_slug: "acme",
    tag: `main-${counter.toString(16).padStart(8, "0")}`,
    repository: "file:///srv/git/app.git",
    config_path: "platform.yaml",
    auto_deploy: true,
    created_by: "api_key:k",
    ...overrides,
  };
}

/** Queues a build (and its deploy) directly through the domain, as the consumer does. */
async function queueBuild(overrides: Partial<BuildRequested> = {}) {
  const req = buildRequest(overrides);
  await service.ctx.write((em) => acceptBuildRequest(em, req, new Date()));
  return { buildId: req.build_id, deployId: req.deploy_action_id!, req };
}

const row = (id: string) => service.ctx.read((em) => em.findOneOrFail(Action, { id }));

/** Publishes a domain event as the services' outboxes do. */
async function announce(subject: string, data: Record<string, unknown>) {
  const id = randomUUID();
  await bus.js.publish(bus.subject(subject), JSON.stringify({ id, data }), { msgID: id });
}
const sql = (query: string, params: unknown[] = []) => service.ctx.write((em) => em.getConnection().execute(query, params, "all", em.getTransactionContext()));

async function heartbeat(hostId: string, extra: Record<string, unknown> = {}) {
  bus.nc.publish(bus.subject(subjects.heartbeat(hostId)), JSON.stringify({ host_id: hostId, version: "0.1.0", schedulable: true, cpus: 2, ...extra }));
  await expect.poll(() => service.ctx.read((em) => em.findOne(Agent, { hostId })), { timeout: 5000 }).toBeTruthy();
}

/** Every work message published on `subject` so far (an ephemeral consumer reads the stream). */
async function workMessages(subject: string): Promise<Array<{ action_id: string; action_type: string }>> {
  const stream = subjects.streams(bus.prefix).work.name;
  const info = await bus.jsm.consumers.add(stream, {
    filter_subject: bus.subject(subject),
    ack_policy: AckPolicy.None,
    deliver_policy: DeliverPolicy.All,
    inactive_threshold: 10_000_000_000,
  });
  try {
    const consumer = await bus.js.consumers.get(stream, info.name);
    const out: Array<{ action_id: string; action_type: string }> = [];
    const batch = await consumer.fetch({ max_messages: 500, expires: 1000 });
    for await (const m of batch) out.push(m.json<EventEnvelope>().data as { action_id: string; action_type: string });
    return out;
  } finally {
    await bus.jsm.consumers.delete(stream, info.name).catch(() => undefined);
  }
}

async function publishBuildRequested(eventId: string, data: BuildRequested, msgID = randomUUID()) {
  return bus.js.publish(bus.subject(subjects.events.buildRequested), JSON.stringify({ id: eventId, data }), { msgID });
}

async function claim(actionId: string, hostId: string) {
  return client.claimAction({ actionId, hostId });
}

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  service = await build(
    loadConfig(deployQueueEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent" }),
  );
  client = createServiceClient(DeployQueueService, `http://127.0.0.1:${service.rpc.port}`);
  bus = await connectBus({ url: testNatsUrl(), name: "deploy-queue-test", prefix });
  subscribe(bus, subjects.events.actionUpdated, (e) => void updates.push(e), logger);
  await bus.nc.flush();
});

afterAll(async () => {
  await bus?.close();
  await service?.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

describe("build_requested", () => {
  it("creates the BUILD (id = build id) and its dependent DEPLOY, dispatched to work.any when no agent is live", async () => {
    // Quotes, a backslash, a placeholder character and a line break come through the one statement intact.
    const message = `Fix the "thing" it's C:\\temp? ok\nsecond line ✓`;
    const req = buildRequest({ commit_message: message, commit_author: "Ada O'Neil" });
    await publishBuildRequested(randomUUID(), req);
    await expect.poll(() => service.ctx.read((em) => em.count(Action, { id: { $in: [req.build_id, req.deploy_action_id!] } })), { timeout: 10_000 }).toBe(2);

    const b = await row(req.build_id);
    expect(b).toMatchObject({ actionType: "BUILD", status: "queued", groupSlug: "acme", appName: req.app_name, imageTag: req.tag, dependsOn: null, autoDeploy: true, dispatchedTo: null, commitMessage: message, commitAuthor: "Ada O'Neil" });
    expect(b.payload).toEqual({ build_id: req.build_id, repository: req.repository, branch: "main", config_path: "platform.yaml", tag: req.tag, app_name: req.app_name, group_slug: "acme", auto_deploy: true });
    const d = await row(req.deploy_action_id!);
    expect(d).toMatchObject({ actionType: "DEPLOY", status: "queued", dependsOn: req.build_id, imageTag: req.tag, dispatchedTo: null });

    await expect.poll(() => workMessages(subjects.work.any), { timeout: 5000 }).toEqual(
      expect.arrayContaining([
        { action_id: req.build_id, action_type: "BUILD" },
        { action_id: req.deploy_action_id, action_type: "DEPLOY" },
      ]),
    );
    // The DEPLOY's announcement went out with the work messages: nothing is left for the relay.
    await expect.poll(() => updates.filter((e) => e.data.action_id === req.deploy_action_id).map((e) => e.data.status), { timeout: 5000 }).toEqual(["queued"]);
    await expect.poll(async () => (await sql("select count(*)::int as n from outbox"))[0]?.n, { timeout: 5000 }).toBe(0);
  });

  it("creates a BUILD alone without auto_deploy", async () => {
    const { buildId, req } = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    expect((await row(buildId)).autoDeploy).toBe(false);
    expect(await service.ctx.read((em) => em.count(Action, { appName: req.app_name }))).toBe(1);
  });

  it("runs an event delivered twice (and a second event for the same build) once", async () => {
    const req = buildRequest();
    const eventId = randomUUID();
    await publishBuildRequested(eventId, req);
    await publishBuildRequested(eventId, req);
    const last = await publishBuildRequested(randomUUID(), req);
    const events = subjects.streams(bus.prefix).events.name;
    await expect
      .poll(
        async () => {
          const info = await bus.jsm.consumers.info(events, BUILD_REQUESTED_DURABLE);
          return info.ack_floor.stream_seq >= last.seq && info.num_ack_pending === 0;
        },
        { timeout: 10_000 },
      )
      .toBe(true);
    expect(await service.ctx.read((em) => em.count(Action, { appName: req.app_name }))).toBe(2);
    // One work message per action: the stream holds each once (JetStream drops a repeated id).
    const ours = (await workMessages(subjects.work.all)).filter((m) => m.action_id === req.build_id || m.action_id === req.deploy_action_id);
    expect(ours.map((m) => m.action_type).sort()).toEqual(["BUILD", "DEPLOY"]);
  });

  it("drops a malformed event without holding up the next one", async () => {
    await publishBuildRequested(randomUUID(), { ...buildRequest(), build_id: "not-a-uuid" });
    const req = buildRequest({ auto_deploy: false, deploy_action_id: null });
    await publishBuildRequested(randomUUID(), req);
    await expect.poll(() => service.ctx.read((em) => em.count(Action, { id: req.build_id })), { timeout: 10_000 }).toBe(1);
    const info = await bus.jsm.consumers.info(subjects.streams(bus.prefix).events.name, BUILD_REQUESTED_DURABLE);
    expect(info.num_redelivered).toBe(0);
  });

  it("dispatches to a live agent's host subject, the deploy beside its build", async () => {
    await heartbeat("h-place-b");
    await heartbeat("h-place-a");
    // A busier host is not chosen.
    const busy = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await sql("update actions set dispatched_to = 'h-place-a' where id = ?", [busy.buildId]);
    expect((await claim(busy.buildId, "h-place-a")).claimed).toBe(true);

    const req = buildRequest();
    await publishBuildRequested(randomUUID(), req);
    await expect.poll(() => service.ctx.read((em) => em.count(Action, { appName: req.app_name })), { timeout: 10_000 }).toBe(2);
    expect((await row(req.build_id)).dispatchedTo).toBe("h-place-b");
    expect((await row(req.deploy_action_id!)).dispatchedTo).toBe("h-place-b");
    await expect.poll(() => workMessages(subjects.work.host("h-place-b")), { timeout: 5000 }).toEqual([
      { action_id: req.build_id, action_type: "BUILD" },
      { action_id: req.deploy_action_id, action_type: "DEPLOY" },
    ]);
    await client.completeAction({ actionId: busy.buildId, hostId: "h-place-a", status: "completed" });
  });

  it("records heartbeats: facts, version, schedulable", async () => {
    await heartbeat("h-facts", { version: "9.9.9", schedulable: false, load: [1, 2, 3] });
    const agent = await service.ctx.read((em) => em.findOneOrFail(Agent, { hostId: "h-facts" }));
    expect(agent).toMatchObject({ version: "9.9.9", schedulable: false });
    expect(agent.facts).toMatchObject({ load: [1, 2, 3] });
  });
});

describe("claims", () => {
  it("lets exactly one of two concurrent claims win; a redelivery to the winner resumes, to the loser drops", async () => {
    const { buildId } = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    const [a, b] = await Promise.all([claim(buildId, "h-race-1"), claim(buildId, "h-race-2")]);
    expect([a.claimed, b.claimed].filter(Boolean)).toHaveLength(1);
    const winner = a.claimed ? "h-race-1" : "h-race-2";
    const loser = a.claimed ? b : a;
    expect(loser).toMatchObject({ claimed: false, drop: true, refusalReason: `claimed by host ${winner}` });
    const won = a.claimed ? a : b;
    expect(won.action).toMatchObject({ actionId: buildId, status: "in_progress", claimedBy: winner, queueStatus: "build_in_progress" });
    expect(JSON.parse(won.action!.payloadJson)).toMatchObject({ build_id: buildId });

    expect(await claim(buildId, winner)).toMatchObject({ claimed: true, drop: false });
    expect((await row(buildId)).claimedBy).toBe(winner);
  });

  it("refuses a dependent DEPLOY until its BUILD completes, recording the reason, and clears the reason on claim", async () => {
    const { buildId, deployId } = await queueBuild();
    const refused = await claim(deployId, "h-dep");
    expect(refused).toMatchObject({ claimed: false, drop: false, refusalReason: `waiting for ${buildId} (queued)`, blockingActionId: buildId });
    let d = await client.getAction({ caller: acme, actionId: deployId });
    expect(d).toMatchObject({ admissionCheckReason: `waiting for ${buildId} (queued)`, stuckClass: "build_in_progress", status: "queued" });
    expect(d.lastAdmissionCheckAt).toBeTruthy();

    expect((await claim(buildId, "h-dep")).claimed).toBe(true);
    expect((await claim(deployId, "h-dep")).refusalReason).toBe(`waiting for ${buildId} (in_progress)`);
    await client.completeAction({ actionId: buildId, hostId: "h-dep", status: "completed", resultJson: JSON.stringify({ commit_message: "Ship it", commit_author: "Grace", images: ["x"] }) });

    const claimed = await claim(deployId, "h-dep");
    expect(claimed.claimed).toBe(true);
    d = await client.getAction({ caller: acme, actionId: deployId });
    expect(d).toMatchObject({ status: "in_progress", claimedBy: "h-dep", commitMessage: "Ship it", commitAuthor: "Grace" });
    expect(d.admissionCheckReason).toBeUndefined();
    // The check that let the claim through is the last one made.
    expect(d.lastAdmissionCheckAt).toBe(d.claimedAt);
    expect(d.stuckClass).toBeUndefined();
    await client.completeAction({ actionId: deployId, hostId: "h-dep", status: "completed" });
  });

  it("fails the dependent DEPLOY when its BUILD fails", async () => {
    const { buildId, deployId } = await queueBuild();
    await claim(buildId, "h-fail");
    await client.completeAction({ actionId: buildId, hostId: "h-fail", status: "failed", errorMessage: "npm ci exited 1" });
    expect(await row(buildId)).toMatchObject({ status: "failed", errorMessage: "npm ci exited 1" });
    expect(await row(deployId)).toMatchObject({ status: "failed", errorMessage: `Dependency BUILD ${buildId} failed.` });
    expect(await claim(deployId, "h-fail")).toMatchObject({ claimed: false, drop: true });
  });

  it("ignores a second CompleteAction, and refuses one from a host that did not claim", async () => {
    const { buildId } = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await claim(buildId, "h-done");
    expect((await refusal(client.completeAction({ actionId: buildId, hostId: "h-other", status: "failed" })))?.status).toBe(409);
    await client.completeAction({ actionId: buildId, hostId: "h-done", status: "completed", resultJson: '{"images":["a"]}' });
    const first = await row(buildId);
    await client.completeAction({ actionId: buildId, hostId: "h-done", status: "failed", errorMessage: "late" });
    const second = await row(buildId);
    expect(second).toMatchObject({ status: "completed", errorMessage: null, result: { images: ["a"] } });
    expect(second.completedAt?.getTime()).toBe(first.completedAt?.getTime());
    expect((await refusal(client.completeAction({ actionId: buildId, hostId: "h-done", status: "done" })))?.status).toBe(422);
    expect(await claim(buildId, "h-done")).toMatchObject({ claimed: false, drop: true, refusalReason: "action is completed" });
  });

  it("names no other group's action to a tenant waiting behind it for a host's slot, in the refusal or the diagnosis", async () => {
    const host = "h-tenants";
    const running = [await queueBuild({ auto_deploy: false, deploy_action_id: null }), await queueBuild({ auto_deploy: false, deploy_action_id: null })];
    for (const r of running) expect((await claim(r.buildId, host)).claimed).toBe(true);
    const theirs = await queueBuild({ group_slug: "globex", auto_deploy: false, deploy_action_id: null });
    const mine = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await sql("update actions set dispatched_to = ? where id in (?, ?)", [host, theirs.buildId, mine.buildId]);
    await claim(theirs.buildId, host);
    await client.completeAction({ actionId: running[0]!.buildId, hostId: host, status: "completed" });
    const refused = await claim(mine.buildId, host);
    expect(refused.refusalReason).toBe(`waiting behind 1 ready action(s) (higher priority or older) for a BUILD slot on host ${host}`);
    const diagnosis = await client.diagnoseAction({ caller: acme, actionId: mine.buildId });
    expect(diagnosis.blockingActionId ?? null).toBeNull();
    expect(`${diagnosis.narrative} ${diagnosis.hint}`).not.toContain(theirs.buildId.slice(0, 8));
    // An operator sees every group: the action ahead is named.
    expect((await client.diagnoseAction({ caller: operator(), actionId: mine.buildId })).blockingActionId).toBe(theirs.buildId);
  });

  it("shows a tenant what the agent reported of an action without where it ran (operator-only, as on deployments)", async () => {
    const { buildId, deployId } = await queueBuild();
    await claim(buildId, "h-where");
    await client.completeAction({ actionId: buildId, hostId: "h-where", status: "completed" });
    await claim(deployId, "h-where");
    const reported = { phases: { start: "Started replica 1" }, previous_tag: null, runtime: "process", host: "h-where", instance_status: { "h-where": "running" } };
    await client.completeAction({ actionId: deployId, hostId: "h-where", status: "completed", resultJson: JSON.stringify(reported) });
    expect(JSON.parse((await client.getAction({ caller: acme, actionId: deployId })).resultJson)).toEqual({ phases: { start: "Started replica 1" }, previous_tag: null });
    expect(JSON.parse((await client.diagnoseAction({ caller: acme, actionId: deployId })).action!.resultJson)).not.toHaveProperty("host");
    expect(JSON.parse((await client.getAction({ caller: operator(), actionId: deployId })).resultJson)).toEqual(reported);
  });

  it("drops a work message for an unknown action", async () => {
    expect(await claim(randomUUID(), "h1")).toMatchObject({ claimed: false, drop: true });
    expect(await claim("not-a-uuid", "h1")).toMatchObject({ claimed: false, drop: true });
  });

  it("holds a host to 2 in-flight BUILDs, and lets prioritized work take the next slot", async () => {
    const host = "h-gate";
    const running = [await queueBuild({ auto_deploy: false, deploy_action_id: null }), await queueBuild({ auto_deploy: false, deploy_action_id: null })];
    for (const r of running) expect((await claim(r.buildId, host)).claimed).toBe(true);
    const older = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    const newer = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await sql("update actions set dispatched_to = ? where id in (?, ?)", [host, older.buildId, newer.buildId]);
    for (const w of [older, newer]) {
      const r = await claim(w.buildId, host);
      expect(r).toMatchObject({ claimed: false, drop: false });
      expect(r.refusalReason).toContain(`host ${host} is at its limit of 2 BUILD`);
    }
    expect((await client.getAction({ caller: acme, actionId: older.buildId })).stuckClass).toBe("admission_refused");

    await client.completeAction({ actionId: running[0]!.buildId, hostId: host, status: "completed" });
    const bumped = await client.prioritize({ caller: acme, target: newer.buildId.slice(0, 8) });
    expect(bumped.actionIds).toEqual([newer.buildId]);
    const behind = await claim(older.buildId, host);
    expect(behind.refusalReason).toBe(`waiting behind 1 ready action(s) (higher priority or older) for a BUILD slot on host ${host}`);
    expect((await claim(newer.buildId, host)).claimed).toBe(true);
    await client.completeAction({ actionId: running[1]!.buildId, hostId: host, status: "completed" });
    expect((await claim(older.buildId, host)).claimed).toBe(true);
  });

  it("cancels the deploy of a build whose event came late, once the deploy of a build requested after it has started", async () => {
    const at = (s: number) => new Date(Date.now() - s * 1000).toISOString();
    // B's event is taken and B deployed; A's, asked for earlier, comes after that (redelivered late, say).
    const b = await queueBuild({ app_name: "late-app", requested_at: at(5) });
    await claim(b.buildId, "h-late");
    await client.completeAction({ actionId: b.buildId, hostId: "h-late", status: "completed" });
    expect((await claim(b.deployId, "h-late")).claimed).toBe(true);
    await client.completeAction({ actionId: b.deployId, hostId: "h-late", status: "completed" });
    const a = await queueBuild({ app_name: "late-app", requested_at: at(10) });
    expect((await row(a.buildId)).createdAt.getTime()).toBeLessThan((await row(b.buildId)).createdAt.getTime());
    await claim(a.buildId, "h-late");
    await client.completeAction({ actionId: a.buildId, hostId: "h-late", status: "completed" });

    expect(await claim(a.deployId, "h-late")).toMatchObject({ claimed: false, drop: true });
    const cancelled = await row(a.deployId);
    expect(cancelled).toMatchObject({ status: "cancelled" });
    expect(cancelled.errorMessage).toBe(`Superseded: the deploy ${b.deployId} of a build requested after this one (${b.req.tag}) has already started.`);
    // The other way round, the newer deploy goes ahead as usual.
    const c = await queueBuild({ app_name: "late-app" });
    await claim(c.buildId, "h-late");
    await client.completeAction({ actionId: c.buildId, hostId: "h-late", status: "completed" });
    expect((await claim(c.deployId, "h-late")).claimed).toBe(true);
    await client.completeAction({ actionId: c.deployId, hostId: "h-late", status: "completed" });
  });

  it("runs one DEPLOY per app and branch at a time", async () => {
    const first = await queueBuild({ app_name: "lane-app" });
    const second = await queueBuild({ app_name: "lane-app" });
    for (const b of [first, second]) {
      await claim(b.buildId, "h-lane");
      await client.completeAction({ actionId: b.buildId, hostId: "h-lane", status: "completed" });
    }
    expect((await claim(first.deployId, "h-lane-1")).claimed).toBe(true);
    const refused = await claim(second.deployId, "h-lane-2");
    expect(refused.refusalReason).toBe(`app is busy with DEPLOY ${first.deployId} (in_progress)`);
    const diagnosis = await client.diagnoseAction({ caller: acme, actionId: second.deployId });
    expect(diagnosis.blockingActionId).toBe(first.deployId);
    await client.completeAction({ actionId: first.deployId, hostId: "h-lane-1", status: "completed" });
    expect((await claim(second.deployId, "h-lane-2")).claimed).toBe(true);
  });

  it("takes an app's ready actions in order, whichever an agent tries to claim first", async () => {
    const first = await queueBuild({ app_name: "order-app" });
    const second = await queueBuild({ app_name: "order-app" });
    for (const b of [first, second]) {
      await claim(b.buildId, "h-order");
      await client.completeAction({ actionId: b.buildId, hostId: "h-order", status: "completed" });
    }
    const early = await claim(second.deployId, "h-order");
    expect(early.claimed).toBe(false);
    expect(early.refusalReason).toBe(`waiting behind ${first.deployId.slice(0, 8)} (higher priority or older) of the same app and branch`);
    expect((await claim(first.deployId, "h-order")).claimed).toBe(true);
    await client.completeAction({ actionId: first.deployId, hostId: "h-order", status: "completed" });
    expect((await claim(second.deployId, "h-order")).claimed).toBe(true);
  });
});

describe("admit-force", () => {
  it("clamps the TTL, needs a reason, only for queued actions, and is single use", async () => {
    const host = "h-force";
    const running = [await queueBuild({ auto_deploy: false, deploy_action_id: null }), await queueBuild({ auto_deploy: false, deploy_action_id: null })];
    for (const r of running) await claim(r.buildId, host);
    const waiting = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    expect((await claim(waiting.buildId, host)).claimed).toBe(false);

    const before = Date.now();
    const short = await client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId, reason: "release day", ttlSeconds: 5 });
    expect(short.ttlSeconds).toBe(60);
    expect(new Date(short.expiresAt).getTime() - before).toBeGreaterThanOrEqual(59_000);
    expect((await client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId, reason: "r", ttlSeconds: 99_999 })).ttlSeconds).toBe(3600);
    expect((await client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId, reason: "r", ttlSeconds: 0 })).ttlSeconds).toBe(60);
    const grant = await client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId.slice(0, 8), reason: "release day" });
    expect(grant).toMatchObject({ actionId: waiting.buildId, ttlSeconds: 300 });

    expect(await refusal(client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId, reason: "  " }))).toMatchObject({ status: 422 });
    expect(await refusal(client.admitForce({ caller: acme, actionId: waiting.buildId, reason: "x" }))).toMatchObject({ status: 403 });
    const foreign = await refusal(client.admitForce({ caller: globexAdmin, actionId: waiting.buildId, reason: "x" }));
    const unknown = await refusal(client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId.replace(/^./, (c) => (c === "0" ? "1" : "0")), reason: "x" }));
    const tooShort = await refusal(client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId.slice(0, 7), reason: "x" }));
    for (const e of [foreign, unknown, tooShort]) expect(e?.status).toBe(404);

    const forced = await claim(waiting.buildId, host);
    expect(forced.claimed).toBe(true);
    expect(await row(waiting.buildId)).toMatchObject({ admitForceUsed: true, admitForceReason: "release day", status: "in_progress" });

    const again = await refusal(client.admitForce({ caller: acmeAdmin, actionId: waiting.buildId, reason: "again" }));
    expect(again).toMatchObject({ status: 400, detail: { code: "not_queued", status: "in_progress" } });

    // A fresh grant on another waiting action is not spent by a claim the gates would admit anyway...
    const next = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await client.admitForce({ caller: operator(), actionId: next.buildId, reason: "operator" });
    for (const r of running) await client.completeAction({ actionId: r.buildId, hostId: host, status: "completed" });
    expect((await claim(next.buildId, host)).claimed).toBe(true);
    expect((await row(next.buildId)).admitForceUsed).toBe(false);
    await client.completeAction({ actionId: next.buildId, hostId: host, status: "completed" });
    await client.completeAction({ actionId: waiting.buildId, hostId: host, status: "completed" });
  });
});

describe("progress", () => {
  it("keeps a running build's commit from the report that carries it; its completion has the last word", async () => {
    const { buildId } = await queueBuild();
    await claim(buildId, "h-commit");
    const commit = { hash: "a".repeat(40), message: "Fix the thing", author: "Ann <ann@example.com>", committedAt: "2026-11-24T10:00:00+01:00" };
    await client.reportProgress({ actionId: buildId, hostId: "h-commit", phase: "config", commit });
    expect(await row(buildId)).toMatchObject({
      status: "in_progress",
      commitMessage: "Fix the thing",
      commitAuthor: "Ann <ann@example.com>",
      result: { commit_hash: commit.hash, commit_message: "Fix the thing", commit_author: "Ann <ann@example.com>", commit_committed_at: commit.committedAt },
    });
    await client.completeAction({ actionId: buildId, hostId: "h-commit", status: "completed", resultJson: JSON.stringify({ commit_hash: commit.hash, commit_message: "Fix the thing", images: [] }) });
    expect((await row(buildId))?.result).toEqual({ commit_hash: commit.hash, commit_message: "Fix the thing", images: [] });
  });
});

describe("cancel", () => {
  it("cancels a queued build outright and cascades to its deploy", async () => {
    const { buildId, deployId, req } = await queueBuild();
    const r = await client.cancelAction({ caller: acme, actionId: buildId.slice(0, 8), reason: "wrong branch" });
    expect(r).toMatchObject({ actionId: buildId, status: "cancelled", cancelled: true, cancelRequested: false, queueStatus: "build_cancelled", dependentsCancelled: [deployId], appName: req.app_name });
    // The reason given is the error each of them shows.
    expect(await row(buildId)).toMatchObject({ status: "cancelled", errorMessage: "Cancelled: wrong branch" });
    expect(await row(deployId)).toMatchObject({ status: "cancelled", cancelReason: "wrong branch", errorMessage: `Dependency BUILD ${buildId} was cancelled. Reason: wrong branch` });
    expect(await claim(buildId, "h1")).toMatchObject({ drop: true });
    expect(await client.cancelAction({ caller: acme, actionId: buildId })).toMatchObject({ status: "not_cancellable", cancelled: true });
  });

  it("flags an in-flight build: ReportProgress answers cancel_requested, the deploy is cancelled now", async () => {
    const { buildId, deployId } = await queueBuild();
    await claim(buildId, "h-cancel");
    expect(await client.reportProgress({ actionId: buildId, hostId: "h-cancel", phase: "clone" })).toMatchObject({ cancelRequested: false });
    const r = await client.cancelAction({ caller: acme, actionId: buildId, reason: "stale commit" });
    expect(r).toMatchObject({ status: "cancel_requested", cancelled: false, cancelRequested: true, queueStatus: "build_in_progress", dependentsCancelled: [deployId] });
    // The build may yet complete (past its last phase): the deploy does not say it was cancelled.
    expect(await row(deployId)).toMatchObject({
      status: "cancelled",
      errorMessage: `Cancelled with its dependency BUILD ${buildId}, whose cancel was requested while it ran. Reason: stale commit`,
    });
    expect(await client.reportProgress({ actionId: buildId, hostId: "h-cancel", phase: "build" })).toMatchObject({ cancelRequested: true });
    expect(await client.cancelAction({ caller: acme, actionId: buildId })).toMatchObject({ status: "cancel_requested", dependentsCancelled: [] });
    await client.completeAction({ actionId: buildId, hostId: "h-cancel", status: "cancelled", errorMessage: "Cancelled during clone." });
    // The agent stopped instead of entering "build": the phase stays the last one it ran; the
    // error is the agent's, with the reason given.
    expect(await row(buildId)).toMatchObject({ status: "cancelled", phase: "clone", errorMessage: "Cancelled during clone. Reason: stale commit" });
    // Asked again once it ended: nothing to cancel, and the cancel asked of it in flight is still said.
    expect(await client.cancelAction({ caller: acme, actionId: buildId })).toMatchObject({ status: "not_cancellable", cancelled: true, cancelRequested: true });
  });

  it("refuses a build's cancel once it packages its image, and leaves its deploy queued", async () => {
    const { buildId, deployId } = await queueBuild();
    await claim(buildId, "h-pack");
    await client.reportProgress({ actionId: buildId, hostId: "h-pack", phase: "build:web" });
    await client.reportProgress({ actionId: buildId, hostId: "h-pack", phase: "package" });
    expect(await client.cancelAction({ caller: acme, actionId: buildId })).toMatchObject({ status: "refused_past_point_of_no_return", cancelRequested: false, dependentsCancelled: [] });
    expect(await row(deployId)).toMatchObject({ status: "queued" });
    await client.completeAction({ actionId: buildId, hostId: "h-pack", status: "completed" });
    expect(await row(buildId)).toMatchObject({ status: "completed", errorMessage: null });
  });

  it("cancels a build that asked to package after the cancel came: the agent stops before it", async () => {
    const { buildId } = await queueBuild();
    await claim(buildId, "h-pack2");
    await client.reportProgress({ actionId: buildId, hostId: "h-pack2", phase: "build:web" });
    expect(await client.cancelAction({ caller: acme, actionId: buildId })).toMatchObject({ status: "cancel_requested" });
    expect(await client.reportProgress({ actionId: buildId, hostId: "h-pack2", phase: "package" })).toMatchObject({ cancelRequested: true });
  });

  it("refuses past the point of no return", async () => {
    const { buildId, deployId } = await queueBuild();
    await claim(buildId, "h-swap");
    await client.completeAction({ actionId: buildId, hostId: "h-swap", status: "completed" });
    await claim(deployId, "h-swap");
    await client.reportProgress({ actionId: deployId, hostId: "h-swap", phase: "swap_committed" });
    const r = await client.cancelAction({ caller: acme, actionId: deployId });
    expect(r).toMatchObject({ status: "refused_past_point_of_no_return", cancelled: false, cancelRequested: false });
    await client.reportProgress({ actionId: deployId, hostId: "h-swap", phase: "drain" });
    // An agent resumed after a restart confirms the commit again: still no cancel, and the phase stays.
    expect(await client.reportProgress({ actionId: deployId, hostId: "h-swap", phase: "swap_committed" })).toMatchObject({ cancelRequested: false });
    expect(await row(deployId)).toMatchObject({ phase: "drain" });
    await client.completeAction({ actionId: deployId, hostId: "h-swap", status: "completed" });
  });

  it("answers not_found for unknown and other groups' ids, 422 for a malformed one", async () => {
    const { buildId } = await queueBuild();
    expect(await client.cancelAction({ caller: globex, actionId: buildId })).toMatchObject({ status: "not_found", cancelled: false, appName: "" });
    expect(await client.cancelAction({ caller: acme, actionId: randomUUID() })).toMatchObject({ status: "not_found" });
    expect((await refusal(client.cancelAction({ caller: acme, actionId: "abc" })))?.status).toBe(422);
    expect((await row(buildId)).status).toBe("queued");
  });
});

describe("reads", () => {
  it("GetAction takes an 8+ character prefix: 7 characters are 422; other group and unknown are the same 404", async () => {
    const { buildId } = await queueBuild();
    expect((await client.getAction({ caller: acme, actionId: buildId.slice(0, 8) })).actionId).toBe(buildId);
    expect((await client.getAction({ caller: operator(), actionId: buildId.toUpperCase() })).actionId).toBe(buildId);
    expect(await refusal(client.getAction({ caller: acme, actionId: buildId.slice(0, 7) }))).toMatchObject({ status: 422 });
    expect(await refusal(client.getAction({ caller: acme, actionId: "%%%%%%%%" }))).toMatchObject({ status: 422 });
    const foreign = await refusal(client.getAction({ caller: globex, actionId: buildId }));
    const unknown = await refusal(client.getAction({ caller: globex, actionId: randomUUID() }));
    expect(foreign?.status).toBe(404);
    expect(foreign?.detail).toBe(`Action '${buildId}' not found`);
    expect(unknown?.status).toBe(404);
    expect(String(unknown?.detail).replace(/'[^']+'/, "")).toBe(String(foreign?.detail).replace(/'[^']+'/, ""));
    expect(await refusal(client.diagnoseAction({ caller: globex, actionId: buildId }))).toMatchObject({ status: 404 });
    // An operator who selected a group acts in it alone, by id as in listings: another group's
    // action is not found, to read or to change.
    expect((await client.getAction({ caller: operator("acme", true), actionId: buildId })).actionId).toBe(buildId);
    expect(await refusal(client.getAction({ caller: operator("globex", true), actionId: buildId }))).toMatchObject({ status: 404 });
    expect(await client.cancelAction({ caller: operator("globex", true), actionId: buildId })).toMatchObject({ status: "not_found" });
    expect(await refusal(client.prioritize({ caller: operator("globex", true), target: buildId }))).toMatchObject({ status: 404 });
    expect((await row(buildId)).status).toBe("queued");
  });

  it("ListQueue: group-scoped, live rows unless all, exclude_types, limit", async () => {
    const done = await queueBuild({ group_slug: "acme", app_name: "list-app" });
    await queueBuild({ group_slug: "globex", app_name: "list-app-g" });
    await client.cancelAction({ caller: acme, actionId: done.buildId });

    const live = await client.listQueue({ caller: acme });
    expect(live.items.every((a) => a.groupSlug === "acme" && ["queued", "in_progress"].includes(a.status))).toBe(true);
    expect(live.items.some((a) => a.actionId === done.buildId)).toBe(false);
    const all = await client.listQueue({ caller: acme, all: true, appName: "list-app" });
    expect(all.items.map((a) => a.actionId).sort()).toEqual([done.buildId, done.deployId].sort());
    const times = (await client.listQueue({ caller: acme, all: true })).items.map((a) => a.createdAt);
    expect([...times].sort().reverse()).toEqual(times);

    const noDeploys = await client.listQueue({ caller: acme, excludeTypes: ["deploy", "NOPE"] });
    expect(noDeploys.items.length).toBeGreaterThan(0);
    expect(noDeploys.items.every((a) => a.actionType !== "DEPLOY")).toBe(true);
    expect((await client.listQueue({ caller: acme, all: true, limit: 1 })).items).toHaveLength(1);
    expect(await refusal(client.listQueue({ caller: acme, limit: 501 }))).toMatchObject({ status: 422 });

    const everyone = await client.listQueue({ caller: operator("acme"), all: true, limit: 500 });
    expect(new Set(everyone.items.map((a) => a.groupSlug))).toEqual(new Set(["acme", "globex"]));
    const selected = await client.listQueue({ caller: inGroup(operator("globex"), "globex"), all: true });
    expect(new Set(selected.items.map((a) => a.groupSlug))).toEqual(new Set(["globex"]));
    expect((await client.listQueue({ caller: globex })).items.every((a) => a.groupSlug === "globex")).toBe(true);
  });

  it("computes stuck_class: never_claimed, admission_refused, in_progress, build_in_progress", async () => {
    const never = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await sql("update actions set created_at = now() - interval '3 minutes' where id = ?", [never.buildId]);
    expect((await client.getAction({ caller: acme, actionId: never.buildId })).stuckClass).toBe("never_claimed");

    const waiting = await queueBuild();
    await claim(waiting.buildId, "h-stuck");
    expect((await client.getAction({ caller: acme, actionId: waiting.deployId })).stuckClass).toBe("build_in_progress");
    expect((await client.getAction({ caller: acme, actionId: waiting.buildId })).stuckClass).toBeUndefined();
    await sql("update actions set progress_at = now() - interval '11 minutes' where id = ?", [waiting.buildId]);
    expect((await client.getAction({ caller: acme, actionId: waiting.buildId })).stuckClass).toBe("in_progress");
    await client.reportProgress({ actionId: waiting.buildId, hostId: "h-stuck", phase: "build" });
    expect((await client.getAction({ caller: acme, actionId: waiting.buildId })).stuckClass).toBeUndefined();
    // Its host silent as well for over a minute: stuck without the full 2 minutes.
    await heartbeat("h-stuck");
    await sql("update actions set progress_at = now() - interval '70 seconds' where id = ?", [waiting.buildId]);
    expect((await client.getAction({ caller: acme, actionId: waiting.buildId })).stuckClass).toBeUndefined();
    await sql("update agents set last_seen = now() - interval '70 seconds' where host_id = 'h-stuck'");
    expect((await client.getAction({ caller: acme, actionId: waiting.buildId })).stuckClass).toBe("in_progress");
    await client.reportProgress({ actionId: waiting.buildId, hostId: "h-stuck", phase: "package" });

    await client.completeAction({ actionId: waiting.buildId, hostId: "h-stuck", status: "completed" });
    await sql("update actions set admission_check_reason = 'host h-x is at its limit', last_admission_check_at = now() where id = ?", [waiting.deployId]);
    const listed = (await client.listQueue({ caller: acme })).items.find((a) => a.actionId === waiting.deployId);
    expect(listed?.stuckClass).toBe("admission_refused");
  });

  it("diagnoses: state, dependency, gate state and one hint", async () => {
    const { buildId, deployId } = await queueBuild();
    await claim(deployId, "h-diag");
    const d = await client.diagnoseAction({ caller: acme, actionId: deployId.slice(0, 12) });
    expect(d.action?.actionId).toBe(deployId);
    expect(d.narrative).toContain("is queued");
    expect(d.narrative).toContain(`It depends on BUILD ${buildId}, which is queued`);
    expect(d.narrative).toContain(`waiting for ${buildId} (queued)`);
    expect(d.hint).toContain(`starts when BUILD ${buildId} completes`);
    expect(d.blockingActionId).toBe(buildId);

    // The build runs on a host that went silent: the deploy's hint says so, not "nothing to do".
    await heartbeat("h-gone");
    await claim(buildId, "h-gone");
    await sql("update agents set last_seen = now() - interval '2 minutes' where host_id = ?", ["h-gone"]);
    const silent = await client.diagnoseAction({ caller: acme, actionId: deployId });
    expect(silent.hint).toContain("host h-gone, which runs it, has been silent since 2 min ago");
    expect(silent.hint).toContain("fails after 3 minutes without progress");
    // The build itself, claimed by that silent host and quiet past the stuck window: only the wait ends it, not a cancel.
    await sql("update actions set progress_at = now() - interval '2 minutes' where id = ?", [buildId]);
    const orphan = await client.diagnoseAction({ caller: acme, actionId: buildId });
    expect(orphan.hint).toBe(
      "The agent on host h-gone is silent: check that host's agent. If it does not come back, the action fails 3 minutes after its last report; a cancel would wait for the agent too.",
    );

    // An error message ending in a full stop is not given a second one.
    await client.completeAction({ actionId: buildId, hostId: "h-gone", status: "failed", errorMessage: "The build command exited with code 1." });
    const failed = await client.diagnoseAction({ caller: acme, actionId: buildId });
    expect(failed.narrative).toMatch(/: The build command exited with code 1\.$/);
    expect(failed.narrative).not.toContain("..");
  });
});

describe("prioritize", () => {
  it("bumps every live action of an app, or a build and its deploy, inside the caller's group", async () => {
    const a = await queueBuild({ app_name: "prio-app" });
    const bumped = await client.prioritize({ caller: acme, target: "prio-app" });
    expect(bumped.actionIds.sort()).toEqual([a.buildId, a.deployId].sort());
    const first = (await row(a.buildId)).priority;
    expect(first).toBeGreaterThan(0);
    // The slug in any case, as every app route takes it.
    expect((await client.prioritize({ caller: acme, target: " PRIO-App" })).actionIds.sort()).toEqual([a.buildId, a.deployId].sort());

    const b = await queueBuild({ app_name: "prio-app-2" });
    const byId = await client.prioritize({ caller: acme, target: b.buildId.slice(0, 10) });
    expect(byId.actionIds).toEqual([b.buildId, b.deployId]);
    expect((await row(b.deployId)).priority).toBeGreaterThan(first);

    expect(await refusal(client.prioritize({ caller: globex, target: "prio-app" }))).toMatchObject({ status: 404 });
    expect(await refusal(client.prioritize({ caller: globex, target: b.buildId }))).toMatchObject({ status: 404 });
    expect(await refusal(client.prioritize({ caller: acme, target: "" }))).toMatchObject({ status: 422 });
  });

  it("finds an app for an operator who named no group where one group has it, and asks which when several do", async () => {
    const a = await queueBuild({ app_name: "op-prio" });
    expect((await client.prioritize({ caller: operator(), target: "op-prio" })).actionIds.sort()).toEqual([a.buildId, a.deployId].sort());
    await queueBuild({ app_name: "op-prio", group_slug: "globex" });
    expect(await refusal(client.prioritize({ caller: operator(), target: "op-prio" }))).toMatchObject({
      status: 409,
      detail: { code: "app_in_several_groups", groups: ["acme", "globex"] },
    });
    expect((await client.prioritize({ caller: operator("acme", true), target: "op-prio" })).actionIds.sort()).toEqual([a.buildId, a.deployId].sort());
    // An action id resolves inside the group an operator selected, like an app name.
    expect(await refusal(client.prioritize({ caller: operator("globex", true), target: a.buildId.slice(0, 8) }))).toMatchObject({ status: 404 });
    expect((await client.prioritize({ caller: operator("acme", true), target: a.buildId.slice(0, 8) })).actionIds).toContain(a.buildId);
    expect(await refusal(client.prioritize({ caller: operator(), target: "no-such-app" }))).toMatchObject({ status: 404, detail: expect.stringContaining("in any group") });
  });
});

describe("events", () => {
  it("announces every state change as action_updated with the live lifecycle name", async () => {
    const { buildId, req } = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    const auto = await queueBuild({});
    await claim(buildId, "h-events");
    await client.reportProgress({ actionId: buildId, hostId: "h-events", phase: "clone" });
    await client.completeAction({ actionId: buildId, hostId: "h-events", status: "completed", resultJson: '{"commit_hash":"abc"}' });
    const mine = () => updates.filter((e) => e.data.action_id === buildId).map((e) => e.data);
    // A BUILD's queued state is not news (apps-builds wrote the builds row queued when it asked
    // for it); its DEPLOY's is, to the app's last_deploy_* fields.
    await expect.poll(() => mine().map((d) => d.queue_status), { timeout: 10_000 }).toEqual(["build_in_progress", "build_in_progress", "build_completed"]);
    await expect.poll(() => updates.filter((e) => e.data.action_id === auto.deployId).map((e) => e.data.status), { timeout: 10_000 }).toEqual(["queued"]);
    expect(updates.some((e) => e.data.action_id === auto.buildId)).toBe(false);
    const last = mine().at(-1)!;
    expect(last).toMatchObject({
      action_id: buildId,
      action_type: "BUILD",
      status: "completed",
      queue_status: "build_completed",
      phase: "clone",
      error_message: null,
      result: { commit_hash: "abc" },
      app_name: req.app_name,
      branch: "main",
      group_slug: "acme",
    });
    expect(typeof last.claimed_at).toBe("string");
    expect(typeof last.completed_at).toBe("string");
  });
});

describe("preflights", () => {
  const preflight = (overrides: Record<string, unknown> = {}) => ({
    action_id: randomUUID(),
    app_id: randomUUID(),
    nonce: 1,
    app_name: `pf${++counter}`,
    branch: "main",
    group_slug: "acme",
    requested_by: "api_key:k",
    requested_at: new Date().toISOString(),
    ...overrides,
  });
  const publish = (subject: string, data: Record<string, unknown>) =>
    bus.js.publish(bus.subject(subject), JSON.stringify({ id: randomUUID(), data }), { msgID: randomUUID() });

  it("records a preflight as a GIT_PREFLIGHT action, outside the lane, until apps-builds says how it ended", async () => {
    const p = preflight();
    await publish(subjects.events.preflightRequested, p);
    await expect.poll(() => client.getAction({ caller: acme, actionId: p.action_id }).catch(() => null), { timeout: 10_000 }).toMatchObject({
      actionType: "GIT_PREFLIGHT",
      status: "queued",
      appName: p.app_name,
    });
    expect((await client.listQueue({ caller: acme, appName: p.app_name.toUpperCase() })).items.map((a) => a.actionId)).toEqual([p.action_id]);
    expect(await row(p.action_id)).toMatchObject({ dispatchedTo: null, createdBy: "api_key:k" });
    const diagnosis = await client.diagnoseAction({ caller: acme, actionId: p.action_id });
    expect(diagnosis.narrative).toContain("fast request to any agent, outside the deploy lane");
    expect(await client.cancelAction({ caller: acme, actionId: p.action_id })).toMatchObject({ status: "not_cancellable", cancelled: false });
    expect(await refusal(client.admitForce({ caller: acmeAdmin, actionId: p.action_id, reason: "try" }))).toMatchObject({ status: 400, detail: { code: "not_gated" } });

    await publish(subjects.events.preflightChecked, { ...p, status: "completed", preflight_status: "ready", message: "The repository check answered ready.", checked_at: new Date().toISOString() });
    await expect.poll(async () => (await client.getAction({ caller: acme, actionId: p.action_id })).status, { timeout: 10_000 }).toBe("completed");
    const done = await client.getAction({ caller: acme, actionId: p.action_id });
    expect(JSON.parse(done.resultJson)).toEqual({ preflight_status: "ready", message: "The repository check answered ready." });
    expect(done.errorMessage ?? null).toBeNull();
    expect(await client.getAction({ caller: globex, actionId: p.action_id }).catch((e: Error) => e.message)).toMatch(/not found/i);
  });

  it("keeps how a preflight ended when the news of its end comes before its request", async () => {
    const p = preflight();
    await publish(subjects.events.preflightChecked, { ...p, status: "cancelled", preflight_status: null, message: "A newer preflight of the app replaced it before an agent was asked.", checked_at: new Date().toISOString() });
    await expect.poll(() => row(p.action_id).catch(() => null), { timeout: 10_000 }).toMatchObject({ status: "cancelled", actionType: "GIT_PREFLIGHT" });
    await publish(subjects.events.preflightRequested, p);
    const marker = preflight();
    await publish(subjects.events.preflightRequested, marker);
    await expect.poll(() => row(marker.action_id).catch(() => null), { timeout: 10_000 }).toBeTruthy();
    expect(await row(p.action_id)).toMatchObject({ status: "cancelled", errorMessage: "A newer preflight of the app replaced it before an agent was asked." });
  });
});

describe("a renamed or deleted group", () => {
  /** Publishes one of identity's group events, as its outbox relay would. */
  const actionsOf = (groupSlug: string) => service.ctx.read((em) => em.find(Action, { groupSlug }));
  const historyOf = (groupSlug: string) => service.ctx.read((em) => em.find(HistoryRecord, { groupSlug }));

  it("moves the group's actions, their work description and its deployment history to the new slug (group_renamed)", async () => {
    const moving = await queueBuild({ group_slug: "umbrella", app_name: "hive" });
    const staying = await queueBuild({ group_slug: "tyrell", app_name: "nexus" });
    await service.ctx.write(async (em) => {
      const deploy = await em.findOneOrFail(Action, { id: moving.deployId });
      Object.assign(deploy, { status: "completed", completedAt: new Date() });
      recordHistory(em, deploy, new Date());
    });

    await announce(subjects.events.groupRenamed, { group_id: randomUUID(), slug: "umbrella-corp", previous_slug: "umbrella" });
    await expect.poll(async () => (await actionsOf("umbrella-corp")).length, { timeout: 10_000 }).toBe(2);
    expect(await actionsOf("umbrella")).toEqual([]);
    expect((await row(moving.buildId)).payload).toMatchObject({ group_slug: "umbrella-corp", app_name: "hive" });
    expect((await historyOf("umbrella-corp")).map((h) => h.deploymentId)).toEqual([moving.deployId]);
    const listed = await client.listQueue({ caller: caller("umbrella-corp"), all: true });
    expect(listed.items.map((a) => a.actionId).sort()).toEqual([moving.buildId, moving.deployId].sort());
    expect((await client.listQueue({ caller: caller("umbrella"), all: true })).items).toEqual([]);
    expect((await row(staying.buildId)).groupSlug).toBe("tyrell");

    // A build requested under the old slug and handled after the rename is filed under the new one.
    const late = await queueBuild({ group_slug: "umbrella", app_name: "hive-late" });
    expect(await row(late.buildId)).toMatchObject({ groupSlug: "umbrella-corp", payload: expect.objectContaining({ group_slug: "umbrella-corp" }) });
    expect((await row(late.deployId)).groupSlug).toBe("umbrella-corp");
  });

  it("remembers every earlier slug of a renamed group, through renames in a row and back", async () => {
    await service.ctx.write((em) => rekeyGroup(em, "wayne", "wayne-co"));
    await service.ctx.write((em) => rekeyGroup(em, "wayne-co", "wayne-ent"));
    const now = (slugs: string[]) => service.ctx.read((em) => currentSlugs(em, slugs));
    expect(await now(["wayne", "wayne-co", "wayne-ent", "tyrell"])).toEqual(new Map([["wayne", "wayne-ent"], ["wayne-co", "wayne-ent"]]));
    await service.ctx.write((em) => rekeyGroup(em, "wayne-ent", "wayne"));
    expect(await now(["wayne", "wayne-co", "wayne-ent"])).toEqual(new Map([["wayne-co", "wayne"], ["wayne-ent", "wayne"]]));
    // A deleted group's slugs are forgotten: a new group may take them.
    await service.ctx.write((em) => forgetGroup(em, ["wayne", "wayne-co", "wayne-ent"]));
    expect(await now(["wayne", "wayne-co", "wayne-ent"])).toEqual(new Map());
  });

  it("drops the actions and history under any slug a deleted group had (group_deleted)", async () => {
    const straggler = await queueBuild({ group_slug: "umbrella", app_name: "hive-old" });
    await announce(subjects.events.groupDeleted, { group_id: randomUUID(), slugs: ["umbrella-corp", "umbrella"] });
    await expect.poll(async () => (await actionsOf("umbrella-corp")).length + (await actionsOf("umbrella")).length, { timeout: 10_000 }).toBe(0);
    expect(await historyOf("umbrella-corp")).toEqual([]);
    expect(await service.ctx.read((em) => em.findOne(Action, { id: straggler.buildId }))).toBeNull();
    expect((await actionsOf("tyrell")).length).toBeGreaterThan(0);
  });
});

describe("a deleted branch (builds_deleted with branch_deleted)", () => {
  const actionsOf = (appName: string) => service.ctx.read((em) => em.find(Action, { groupSlug: "acme", appName }));
  const historyOf = (appName: string) => service.ctx.read((em) => em.find(HistoryRecord, { groupSlug: "acme", appName }));
  const deleted = (appName: string, deletedAt: Date, branchDeleted = true) =>
    announce(subjects.events.buildsDeleted, { group_slug: "acme", app_name: appName, branch: "main", build_ids: [], branch_deleted: branchDeleted, deleted_at: deletedAt.toISOString() });
  const finished = async (appName: string) => {
    const { buildId, deployId } = await queueBuild({ group_slug: "acme", app_name: appName });
    await service.ctx.write(async (em) => {
      for (const id of [buildId, deployId]) Object.assign(await em.findOneOrFail(Action, { id }), { status: "completed", completedAt: new Date() });
      recordHistory(em, await em.findOneOrFail(Action, { id: deployId }), new Date());
    });
  };

  it("drops the branch's actions and deployment history as they were when it was deleted, and nothing of a purge", async () => {
    await finished("gone");
    await finished("kept");
    await deleted("kept", new Date(), false);
    await deleted("gone", new Date());
    await expect.poll(async () => (await actionsOf("gone")).length, { timeout: 10_000 }).toBe(0);
    expect(await historyOf("gone")).toEqual([]);
    expect((await actionsOf("kept")).length).toBe(2);
    expect((await historyOf("kept")).length).toBe(1);
  });

  it("keeps what the branch registered again has, when the deletion is told late", async () => {
    await finished("reborn");
    await finished("marker");
    await deleted("reborn", new Date(Date.now() - 60_000));
    // Events of one subject are handled in order: once the later one is, the earlier one was.
    await deleted("marker", new Date());
    await expect.poll(async () => (await actionsOf("marker")).length, { timeout: 10_000 }).toBe(0);
    expect((await actionsOf("reborn")).length).toBe(2);
    expect((await historyOf("reborn")).length).toBe(1);
  });
});

describe("upkeep", () => {
  it("prunes terminal rows 30 days after they finished, never live ones", async () => {
    const old = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    const recent = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    const ancientLive = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await client.cancelAction({ caller: acme, actionId: old.buildId });
    await client.cancelAction({ caller: acme, actionId: recent.buildId });
    await sql("update actions set completed_at = now() - interval '31 days' where id = ?", [old.buildId]);
    await sql("update actions set completed_at = now() - interval '29 days' where id = ?", [recent.buildId]);
    await sql("update actions set created_at = now() - interval '90 days' where id = ?", [ancientLive.buildId]);
    const pruned = await service.ctx.write((em) => pruneTerminal(em, new Date()));
    expect(pruned.actions).toBe(1);
    const left = await service.ctx.read((em) => em.find(Action, { id: { $in: [old.buildId, recent.buildId, ancientLive.buildId] } }));
    expect(left.map((a) => a.id).sort()).toEqual([recent.buildId, ancientLive.buildId].sort());
  });

  it("dispatches queued work again away from a host that went silent", async () => {
    await heartbeat("h-alive");
    const { buildId } = await queueBuild({ auto_deploy: false, deploy_action_id: null });
    await sql("insert into agents (host_id, last_seen, version) values ('h-dead', now() - interval '5 minutes', '1') on conflict do nothing");
    await sql("update actions set dispatched_to = 'h-dead', dispatched_at = now() - interval '2 minutes' where id = ?", [buildId]);
    await sql("update agents set last_seen = now() - interval '5 minutes' where host_id not in ('h-alive')");
    const moved = await service.ctx.write((em) => redispatchFromSilentHosts(em, new Date()));
    expect(moved.map((a) => a.id)).toContain(buildId);
    expect(await row(buildId)).toMatchObject({ dispatchedTo: "h-alive", retryCount: 1 });
    await expect.poll(() => workMessages(subjects.work.host("h-alive")), { timeout: 5000 }).toContainEqual({ action_id: buildId, action_type: "BUILD" });
  });
});
