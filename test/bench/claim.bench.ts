/**
 * Claim latency of the deploy lane (issue: the build pipeline): the time from an action's commit
 * to an agent's claim, with 50 simulated agents each on its own durable consumer. Target: p99
 * under 25 ms.
 *
 * deploy-queue runs as its own process, started as the fleet starts it (its main.ts, telemetry
 * preloaded), on a fresh database and bus prefix, so its event loop is not shared with the 50
 * agents simulated here. Each simulated agent does what agent/src/work.ts does: it heartbeats on
 * `agent.hb.<host>` so placement counts it live, runs a durable pull consumer on
 * `work.host.<host>` (and the shared `agents-any` on `work.any`), claims each message through the
 * ClaimAction RPC, "runs" the action for a while (long enough that about 80% of the agents are
 * busy at once, so work spreads over the fleet, but no host nears its in-flight limit) and
 * completes it (CompleteAction). Actions are created the real way: `build_requested` events
 * published on the EVENTS stream as the apps-builds outbox relay does (envelope `{id, data}`,
 * `Nats-Msg-Id` = event id), at a steady rate well inside deploy-queue's capacity, so the figure is
 * latency, not a backlog (the CPU line shows the headroom).
 *
 * The figure is `claimed_at - created_at` of each action row, both stamped by deploy-queue's clock:
 * created_at inside the intake transaction (a few ms before its commit, so the figure errs long),
 * claimed_at when the agent's claim request arrives. Also shown: what the agent observes (created_at
 * to ClaimAction returning claimed, so the claim transaction included), the stages in between, and
 * the path from the build_requested publish. The baseline, measured in the same run at the same
 * rate, is a bare JetStream publish-to-consume through 50 durable pull consumers.
 *
 * BENCH_CLAIM_RATE (actions per second, default 20) and BENCH_CLAIM_ACTIONS (default 1000) change
 * the load.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream";
import { serviceSchema } from "@platform/config";
import { connectBus, runConsumer, subjects, type Bus, type EventEnvelope, type JsMsg, type RunningConsumer } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { DeployQueueService } from "@platform/proto";
import { createServiceClient } from "@platform/rpc";
import { createTestDatabase, deleteBusStreams, dropDatabase, freePort, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { Verdict } from "./lib.ts";

const AGENTS = 50;
const ACTIONS = Number(process.env.BENCH_CLAIM_ACTIONS ?? 1000);
const RATE = Number(process.env.BENCH_CLAIM_RATE ?? 20);
/** The baseline's messages: fewer, at the same rate. */
const BASELINE_MESSAGES = Math.ceil(ACTIONS / 2);
/** The first actions (and baseline messages) warm the JIT, pools and connections; not counted. */
const WARMUP = Math.min(100, Math.floor(ACTIONS / 10));
/** How long a simulated agent "runs" an action: about 80% of the agents busy at any moment. */
const WORK_MS = (0.8 * AGENTS * 1000) / RATE;
const TARGET_P99_MS = 25;
/** As agent/src/heartbeat.ts: every 30 s (live means heard from in the last 60). */
const HEARTBEAT_MS = 30_000;

const logger = createLogger({ service: "claim-bench", level: "silent", pretty: false });
/** Sub-millisecond time within this process (the baseline); Date.now() where deploy-queue's clock is compared. */
const now = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Stats {
  n: number;
  p50: number;
  p99: number;
  max: number;
}

function stats(values: number[]): Stats {
  const s = [...values].sort((a, b) => a - b);
  const at = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))] ?? NaN;
  return { n: s.length, p50: at(0.5), p99: at(0.99), max: s[s.length - 1] ?? NaN };
}

const fmt = (s: Stats) => `p50 ${s.p50.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms, max ${s.max.toFixed(1)} ms (n=${s.n})`;

/** Calls `send(i)` for i < count at `rate` per second on a fixed schedule (no drift, no backlog). */
async function paced(count: number, rate: number, send: (i: number) => Promise<unknown>): Promise<void> {
  const start = now();
  const pending: Promise<unknown>[] = [];
  for (let i = 0; i < count; i++) {
    const due = start + (i * 1000) / rate;
    const wait = due - now();
    if (wait > 1) await sleep(wait);
    pending.push(send(i));
  }
  await Promise.all(pending);
}

/** CPU time (user + system) a child process has used, from /proc; 0 where there is none. */
function childCpuMs(child: ChildProcess | undefined): number {
  if (!child?.pid) return 0;
  try {
    const stat = readFileSync(`/proc/${child.pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
  } catch {
    return 0;
  }
}

async function waitFor(what: string, timeoutMs: number, check: () => Promise<boolean>): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

interface Agent {
  hostId: string;
  bus: Bus;
}

interface Observed {
  /** Date.now() when the work message reached the agent, and when ClaimAction returned claimed. */
  deliveredAt: number;
  returnedAt: number;
  /** created_at to ClaimAction returning claimed. */
  claimedMs: number;
}

/**
 * Bare JetStream: one stream, a durable pull consumer per agent on its own subject (on the agent's
 * own connection), messages published round-robin at `rate`; publish to receipt, same clock.
 */
async function baseline(agents: Agent[], publisher: Bus, prefix: string, count: number, rate: number): Promise<Stats> {
  const stream = `${prefix}_CLAIMBASE`;
  const subject = (hostId: string) => `${prefix}.claimbase.${hostId}`;
  await publisher.jsm.streams.add({ name: stream, subjects: [`${prefix}.claimbase.>`] });
  const warmup = Math.min(WARMUP, Math.floor(count / 5));
  const latencies: number[] = [];
  const loops: Array<{ close(): Promise<void | Error> }> = [];
  try {
    for (const a of agents) {
      await a.bus.jsm.consumers.add(stream, {
        durable_name: `base-${a.hostId}`,
        filter_subject: subject(a.hostId),
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
      });
      const consumer = await a.bus.js.consumers.get(stream, `base-${a.hostId}`);
      const messages = await consumer.consume({ max_messages: 64 });
      loops.push(messages);
      void (async () => {
        for await (const m of messages) {
          const { i, sent } = m.json<{ i: number; sent: number }>();
          if (i >= warmup) latencies.push(now() - sent);
          m.ack();
        }
      })();
    }
    await paced(count, rate, (i) => publisher.js.publish(subject(agents[i % agents.length]!.hostId), JSON.stringify({ i, sent: now() }), { msgID: randomUUID() }));
    await waitFor("the baseline's messages", 10_000, async () => latencies.length >= count - warmup);
    return stats(latencies);
  } finally {
    for (const l of loops) await l.close().catch(() => undefined);
    await publisher.jsm.streams.delete(stream).catch(() => undefined);
  }
}

export async function run(): Promise<Verdict[]> {
  const natsUrl = testNatsUrl();
  const prefix = uniquePrefix("cb");
  const databaseUrl = await createTestDatabase();
  let child: ChildProcess | undefined;
  let stopChild: () => Promise<void> = async () => undefined;
  let pool: pg.Pool | undefined;
  let publisher: Bus | undefined;
  let heartbeats: NodeJS.Timeout | undefined;
  const agents: Agent[] = [];
  const consumers: RunningConsumer[] = [];
  try {
    const port = await freePort();
    const root = fileURLToPath(new URL("../../", import.meta.url));
    child = spawn(process.execPath, ["--disable-warning=ExperimentalWarning", "--import", "@platform/telemetry/register", "services/deploy-queue/src/main.ts"], {
      cwd: root,
      env: { ...process.env, DATABASE_URL: databaseUrl, NATS_URL: natsUrl, BUS_PREFIX: prefix, RPC_PORT: String(port), LOG_LEVEL: "warn", OTEL_SERVICE_NAME: "deploy-queue" },
      stdio: ["ignore", "inherit", "inherit"],
    });
    const started = child;
    const killChild = () => started.kill("SIGKILL");
    process.once("exit", killChild);
    stopChild = async () => {
      process.off("exit", killChild);
      if (started.exitCode !== null || started.signalCode !== null) return;
      const exited = new Promise((resolve) => started.once("exit", resolve));
      started.kill("SIGTERM");
      await exited;
    };
    const queueUrl = `http://127.0.0.1:${port}`;
    await waitFor("deploy-queue to be ready", 30_000, async () => {
      if (started.exitCode !== null) throw new Error(`deploy-queue exited with ${started.exitCode}`);
      return (await fetch(`${queueUrl}/readyz`).catch(() => null))?.status === 200;
    });
    const schema = serviceSchema("deploy-queue");
    pool = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    const db = pool;
    publisher = await connectBus({ url: natsUrl, name: "claim-bench-publisher", prefix });

    for (let i = 0; i < AGENTS; i++) {
      const hostId = `bench-${String(i).padStart(2, "0")}`;
      agents.push({ hostId, bus: await connectBus({ url: natsUrl, name: `agent-${hostId}`, prefix }) });
    }
    // Every agent says it is alive now, then every HEARTBEAT_MS with its own phase, as agents
    // started at different moments do (not all 50 in one burst).
    const beat = (a: Agent) => a.bus.nc.publish(a.bus.subject(subjects.heartbeat(a.hostId)), JSON.stringify({ host_id: a.hostId, version: "bench", schedulable: true, cpus: 2 }));
    agents.forEach(beat);
    let tick = 0;
    heartbeats = setInterval(() => beat(agents[tick++ % AGENTS]!), HEARTBEAT_MS / AGENTS);
    await waitFor("deploy-queue to register every agent", 10_000, async () => {
      const { rows } = await db.query<{ n: number }>(`select count(*)::int as n from ${schema}.agents`);
      return rows[0]!.n === AGENTS;
    });

    const base = await baseline(agents, publisher, prefix, BASELINE_MESSAGES, RATE);

    // The agents' deploy lanes, as agent/src/work.ts runs them.
    const observed = new Map<string, Observed>();
    let refusals = 0;
    let failures = 0;
    const workStream = subjects.streams(prefix).work.name;
    for (const a of agents) {
      const queue = createServiceClient(DeployQueueService, queueUrl);
      const handle = async (msg: JsMsg) => {
        const delivered = Date.now();
        const { action_id: actionId } = msg.json<EventEnvelope>().data as { action_id: string };
        let claim;
        try {
          claim = await queue.claimAction({ actionId, hostId: a.hostId });
        } catch (err) {
          failures++;
          throw err;
        }
        const claimedAt = Date.now();
        if (claim.drop) return;
        if (!claim.claimed || !claim.action) {
          refusals++;
          msg.nak(2000);
          return;
        }
        observed.set(actionId, { deliveredAt: delivered, returnedAt: claimedAt, claimedMs: claimedAt - Date.parse(claim.action.createdAt) });
        await sleep(WORK_MS);
        await queue.completeAction({ actionId, hostId: a.hostId, status: "completed", errorMessage: "", resultJson: "{}" });
      };
      consumers.push(await runConsumer({ bus: a.bus, stream: workStream, durable: `agent-${a.hostId}`, filterSubject: a.bus.subject(subjects.work.host(a.hostId)), logger, handle }));
      consumers.push(await runConsumer({ bus: a.bus, stream: workStream, durable: "agents-any", filterSubject: a.bus.subject(subjects.work.any), logger, handle }));
    }

    // apps-builds' side: build_requested events as its outbox relay publishes them.
    const buildIds: string[] = [];
    const cpu0 = { self: process.cpuUsage(), queue: childCpuMs(child), wall: now() };
    const publishedAt = new Map<string, number>();
    const bus = publisher;
    await paced(ACTIONS, RATE, (i) => {
      const id = randomUUID();
      const buildId = randomUUID();
      buildIds.push(buildId);
      const data = {
        build_id: buildId,
        deploy_action_id: null,
        app_name: `bench${i % 20}`,
        branch: "main",
        group_slug: "bench",
        tag: `main-${i.toString(16).padStart(8, "0")}`,
        repository: "https://example.com/bench/app.git",
        config_path: "platform.yaml",
        auto_deploy: false,
        created_by: "bench",
      };
      publishedAt.set(buildId, Date.now());
      return bus.js.publish(bus.subject(subjects.events.buildRequested), JSON.stringify({ id, data }), { msgID: id });
    });
    await waitFor("every action to be claimed and completed", 30_000, async () => {
      const { rows } = await db.query<{ n: number }>(`select count(*)::int as n from ${schema}.actions where status = 'completed'`);
      return rows[0]!.n >= ACTIONS;
    });
    const selfCpu = process.cpuUsage(cpu0.self);
    const cpu = { wall: now() - cpu0.wall, self: (selfCpu.user + selfCpu.system) / 1000, queue: childCpuMs(child) - cpu0.queue };

    const measured = new Set(buildIds.slice(WARMUP));
    const { rows } = await db.query<{ id: string; created: number; latency: number; claimed_by: string }>(
      `select id, (extract(epoch from created_at) * 1000)::float8 as created, (extract(epoch from claimed_at - created_at) * 1000)::float8 as latency, claimed_by
         from ${schema}.actions`,
    );
    const rowsMeasured = rows.filter((r) => measured.has(r.id));
    const dbLatency = stats(rowsMeasured.map((r) => r.latency));
    const obs = [...measured].map((id) => observed.get(id)).filter((o): o is Observed => !!o);
    const agentLatency = stats(obs.map((o) => o.claimedMs));
    const endToEnd = stats(rowsMeasured.map((r) => r.created + r.latency - publishedAt.get(r.id)!));
    const hosts = new Set(rowsMeasured.map((r) => r.claimed_by));

    // Where the time goes, from the agent's side: created_at to the work message reaching it
    // (the rest of the intake transaction, its commit, the publish and JetStream's delivery), on to
    // the claim request reaching deploy-queue (claimed_at), and the claim transaction until the
    // reply is back.
    const claimedAtOf = new Map(rowsMeasured.map((r) => [r.id, r.created + r.latency]));
    const createdOf = new Map(rowsMeasured.map((r) => [r.id, r.created]));
    const staged = [...measured].filter((id) => observed.has(id) && claimedAtOf.has(id)).map((id) => ({ o: observed.get(id)!, created: createdOf.get(id)!, claimed: claimedAtOf.get(id)! }));
    const toAgent = stats(staged.map((r) => r.o.deliveredAt - r.created));
    const agentToHandler = stats(staged.map((r) => r.claimed - r.o.deliveredAt));
    const handlerToReply = stats(staged.map((r) => r.o.returnedAt - r.claimed));

    const ok = dbLatency.n === ACTIONS - WARMUP && dbLatency.p99 < TARGET_P99_MS && failures === 0;
    const pair = (x: Stats) => `${x.p50.toFixed(1)} / ${x.p99.toFixed(1)}`;
    const queueCpu = cpu.queue / ACTIONS;
    const cpuLine =
      queueCpu > 0
        ? `deploy-queue ${queueCpu.toFixed(1)} ms per action (${((cpu.queue / cpu.wall) * 100).toFixed(0)}% of a core at this rate; one core lasts to about ${(1000 / queueCpu).toFixed(0)}/s)`
        : "deploy-queue n/a (no /proc)";
    console.log(
      `  ${ACTIONS} actions at ${RATE}/s (first ${WARMUP} not counted), ${AGENTS} agents, ${WORK_MS} ms per action: claimed by ${hosts.size} hosts, ` +
        `${refusals} refusals, ${failures} failed claims`,
    );
    console.log(`  CPU: ${cpuLine}; the simulated agents ${(cpu.self / ACTIONS).toFixed(1)} ms per action`);
    console.log(`  baseline, bare JetStream publish to consume (${AGENTS} durable pull consumers): ${fmt(base)}`);
    console.log(`  agent-observed, created_at to ClaimAction returned claimed: ${fmt(agentLatency)}`);
    console.log(
      `  stages, p50 / p99 ms: created_at to the work message at the agent ${pair(toAgent)}; on to the claim request at deploy-queue (claimed_at) ` +
        `${pair(agentToHandler)}; claim transaction until the reply is at the agent ${pair(handlerToReply)}`,
    );
    console.log(`  build_requested published to claimed_at (intake included): ${fmt(endToEnd)}`);
    console.log(
      `deploy-queue claim latency (commit to claim, claimed_at - created_at): ${fmt(dbLatency)}; baseline p99 ${base.p99.toFixed(1)} ms; ` +
        `target p99 < ${TARGET_P99_MS} ms ${ok ? "PASS" : "FAIL"}`,
    );
    return [{ name: "deploy-queue claim latency", ok }];
  } finally {
    if (heartbeats) clearInterval(heartbeats);
    for (const c of consumers) await c.stop().catch(() => undefined);
    for (const a of agents) await a.bus.close();
    await publisher?.close();
    await pool?.end();
    await stopChild();
    await deleteBusStreams(prefix, natsUrl).catch(() => undefined);
    await dropDatabase(databaseUrl).catch(() => undefined);
  }
}
