/**
 * The service's background work: the build_requested consumer (durable, idempotent per event),
 * the heartbeat subscription feeding the agents registry, and the periodic jobs (re-dispatch away
 * from silent hosts, pruning of terminal rows).
 */
import { handleOnce, runConsumer, subjects, traceHeaders, type Bus, type EventEnvelope, type RunningConsumer } from "@platform/bus";
import type { Logger } from "@platform/logger";
import type { ServiceContext } from "@platform/service";
import { recordHeartbeat, type HeartbeatMessage } from "./domain/agents.ts";
import { acceptBuildRequest, parseBuildRequested, type BuildRequested } from "./domain/intake.ts";
import { redispatchFromSilentHosts, type Dispatched } from "./domain/placement.ts";
import { PRUNE_INTERVAL_MS, pruneTerminal } from "./domain/pruning.ts";
import { failOrphanedActions } from "./domain/orphans.ts";
import { createAppAction } from "./domain/deployments.ts";

export const BUILD_REQUESTED_DURABLE = "deploy-queue-build-requested";
const BUILD_REQUESTED_LEDGER = "deploy-queue.build-requested";
const REDISPATCH_INTERVAL_MS = 30_000;

/**
 * Publishes committed work messages at once, as the relay would (envelope `{id, data}`,
 * `Nats-Msg-Id` = the outbox event id), so an agent need not wait for the relay's next batch.
 * Only after the transaction that enqueued them has committed. A failure is left to the relay,
 * which publishes every outbox row anyway; its copy is dropped by JetStream as a duplicate.
 */
export async function publishDispatched(bus: Bus, dispatched: Dispatched[], logger: Logger): Promise<void> {
  for (const d of dispatched) {
    try {
      await bus.js.publish(bus.subject(d.subject), JSON.stringify({ id: d.eventId, data: d.message }), { msgID: d.eventId, headers: traceHeaders() });
    } catch (err) {
      logger.warn({ err, action_id: d.message.action_id }, "work message not published at once; the outbox relay will");
    }
  }
}

export function startBuildRequestConsumer(ctx: ServiceContext): Promise<RunningConsumer> {
  const { bus } = ctx;
  return runConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: BUILD_REQUESTED_DURABLE,
    filterSubject: bus.subject(subjects.events.buildRequested),
    logger: ctx.logger,
    async handle(msg) {
      let request: BuildRequested;
      try {
        request = parseBuildRequested(msg.json<EventEnvelope>().data ?? {});
      } catch (err) {
        // Redelivering a malformed event would never make it valid.
        ctx.logger.error({ err, subject: msg.subject }, "malformed build_requested event dropped");
        msg.term("malformed build_requested event");
        return;
      }
      const dispatched: Dispatched[] = [];
      const handled = await handleOnce(ctx.orm, BUILD_REQUESTED_LEDGER, msg, async (em) => {
        dispatched.length = 0;
        const created = await acceptBuildRequest(em, request, new Date(), dispatched);
        if (created.length > 0) {
          ctx.logger.info({ actions: created.map((a) => `${a.actionType}:${a.id}`), app: created[0]!.appName }, "build request queued");
        }
      });
      if (handled) {
        // Committed: the agents get their work now rather than after the relay's next batch.
        await publishDispatched(bus, dispatched, ctx.logger);
        ctx.relay.kick();
      }
    },
  });
}

export const RECONCILE_REQUESTED_DURABLE = "deploy-queue-reconcile-requested";

/**
 * `reconcile_requested` (a visibility flip in apps-builds) becomes a RECONCILE_ROUTING action on
 * the host where the branch runs. Idempotent per event through the consumer's ledger.
 */
export function startReconcileConsumer(ctx: ServiceContext): Promise<RunningConsumer> {
  const { bus } = ctx;
  return runConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: RECONCILE_REQUESTED_DURABLE,
    filterSubject: bus.subject(subjects.events.reconcileRequested),
    logger: ctx.logger,
    async handle(msg) {
      const data = (msg.json<EventEnvelope>().data ?? {}) as Record<string, unknown>;
      const [app, branch, group] = [data.app_name, data.branch, data.group_slug];
      if (typeof app !== "string" || typeof branch !== "string" || typeof group !== "string") {
        ctx.logger.error({ subject: msg.subject }, "malformed reconcile_requested event dropped");
        msg.term("malformed reconcile_requested event");
        return;
      }
      const dispatched: Dispatched[] = [];
      const handled = await handleOnce(ctx.orm, "deploy-queue.reconcile-requested", msg, async (em) => {
        dispatched.length = 0;
        const by = typeof data.requested_by === "string" ? data.requested_by : "platform";
        await createAppAction(em, { actionType: "RECONCILE_ROUTING", groupSlug: group, appName: app, branch }, by, new Date(), dispatched);
      });
      if (handled) {
        await publishDispatched(bus, dispatched, ctx.logger);
        ctx.relay.kick();
      }
    },
  });
}

/**
 * Heartbeats arrive on core NATS (`agent.hb.<host_id>`). The replicas of this service share one
 * queue group, so each heartbeat is written once.
 */
export function startHeartbeatListener(ctx: ServiceContext): { stop(): Promise<void> } {
  const { bus } = ctx;
  const pattern = bus.subject(subjects.heartbeats);
  const sub = bus.nc.subscribe(pattern, { queue: "deploy-queue-heartbeats" });
  const done = (async () => {
    for await (const m of sub) {
      const hostId = m.subject.slice(m.subject.lastIndexOf(".") + 1);
      try {
        const hb = m.json<HeartbeatMessage>();
        if (!hb || typeof hb !== "object") continue;
        const ok = await ctx.write((em) => recordHeartbeat(em, hostId, hb, new Date()));
        if (!ok) ctx.logger.warn({ subject: m.subject }, "malformed heartbeat ignored");
      } catch (err) {
        ctx.logger.warn({ err, subject: m.subject }, "heartbeat not recorded");
      }
    }
  })();
  return {
    async stop() {
      sub.unsubscribe();
      await done;
    },
  };
}

/** Runs `job` every `intervalMs`, never twice at once; `stop` waits for a run in progress. */
function every(intervalMs: number, job: () => Promise<void>): { stop(): Promise<void> } {
  let running: Promise<void> | null = null;
  const timer = setInterval(() => {
    running ??= job().finally(() => {
      running = null;
    });
  }, intervalMs);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await running;
    },
  };
}

export function startPeriodicJobs(ctx: ServiceContext): { stop(): Promise<void> } {
  const redispatch = every(REDISPATCH_INTERVAL_MS, async () => {
    try {
      const moved = await ctx.write((em) => redispatchFromSilentHosts(em, new Date()));
      if (moved.length > 0) ctx.logger.info({ actions: moved.map((a) => a.id) }, "actions dispatched again away from silent hosts");
    } catch (err) {
      ctx.logger.warn({ err }, "re-dispatch failed");
    }
  });
  const orphans = every(REDISPATCH_INTERVAL_MS, async () => {
    try {
      const failed = await ctx.write((em) => failOrphanedActions(em, new Date()));
      if (failed.length > 0) ctx.logger.warn({ actions: failed.map((a) => a.id) }, "actions of silent agents failed");
    } catch (err) {
      ctx.logger.warn({ err }, "orphan check failed");
    }
  });
  const prune = every(PRUNE_INTERVAL_MS, async () => {
    try {
      const pruned = await ctx.write((em) => pruneTerminal(em, new Date()));
      if (pruned.actions + pruned.ledger + pruned.outbox > 0) ctx.logger.info(pruned, "pruned terminal queue rows");
    } catch (err) {
      ctx.logger.warn({ err }, "pruning failed");
    }
  });
  return {
    async stop() {
      await redispatch.stop();
      await orphans.stop();
      await prune.stop();
    },
  };
}
