/**
 * The service's background work: the consumers turning events into actions (build_requested,
 * reconcile_requested, preflight_requested and preflight_checked; durable, idempotent per event),
 * the heartbeat subscription feeding the agents registry, and the periodic jobs (re-dispatch away
 * from silent hosts, failing the actions of silent agents, pruning of terminal rows).
 */
import { handleBatchOnce, parseBuildRequested, receivedEvents, runBatchConsumer, subjects, traceHeaders, type BuildRequested, type EventEnvelope, type RunningConsumer } from "@platform/bus";
import { sqlPool, type EntityManager } from "@platform/db";
import { every, type ServiceContext } from "@platform/service";
import { recordHeartbeat, type HeartbeatMessage } from "./domain/agents.ts";
import { acceptBuildRequests } from "./domain/intake.ts";
import { redispatchFromSilentHosts, type Dispatched } from "./domain/placement.ts";
import { PRUNE_INTERVAL_MS, pruneTerminal } from "./domain/pruning.ts";
import { failOrphanedActions } from "./domain/orphans.ts";
import { createAppAction } from "./domain/deployments.ts";
import { currentSlugs } from "./domain/groups.ts";
import {
  parsePreflightChecked,
  parsePreflightRequested,
  recordPreflightChecks,
  recordPreflightRequests,
  type PreflightChecked,
  type PreflightRequested,
} from "./domain/preflights.ts";

export const BUILD_REQUESTED_DURABLE = "deploy-queue-build-requested";
const REDISPATCH_INTERVAL_MS = 30_000;

/**
 * Publishes committed outbox events at once, as the relay would (envelope `{id, data}`,
 * `Nats-Msg-Id` = the outbox event id), so an agent need not wait for the relay's next batch.
 * Only after the transaction that enqueued them has committed. The outbox rows of the messages
 * sent are then deleted, as the relay deletes what it sends, so it does not send them again; a
 * failure leaves them to the relay, whose copy of anything sent twice JetStream drops as a
 * duplicate. True when every message was sent and its row deleted.
 */
export async function publishDispatched(ctx: Pick<ServiceContext, "bus" | "orm" | "logger">, dispatched: Dispatched[]): Promise<boolean> {
  if (dispatched.length === 0) return true;
  const { bus } = ctx;
  const sent = await Promise.all(
    dispatched.map((d) =>
      bus.js.publish(bus.subject(d.subject), JSON.stringify({ id: d.eventId, data: d.message }), { msgID: d.eventId, headers: traceHeaders() }).then(
        () => d.eventId,
        (err: unknown) => {
          ctx.logger.warn({ err, action_id: d.message.action_id }, "event not published at once; the outbox relay will");
          return null;
        },
      ),
    ),
  );
  const ids = sent.filter((id): id is string => id !== null);
  if (ids.length === 0) return false;
  return (await sqlPool(ctx.orm))
    .query({ name: "outbox-delete-dispatched", text: "delete from outbox where id = any($1::uuid[])", values: [ids] })
    .then(
      () => ids.length === dispatched.length,
      (err: unknown) => {
        ctx.logger.warn({ err }, "could not delete the outbox rows of events sent; the relay will send them again");
        return false;
      },
    );
}

/**
 * A durable, idempotent consumer of one event subject that turns events into queue actions, a
 * batch of events at a time: `parse` checks each event (a malformed one is terminated:
 * redelivering it would never make it valid), `accept` writes the actions of the batch in the
 * transaction that records its events as handled, and once that has committed their work
 * messages go out at once rather than at the relay's next batch.
 */
function startIntake<T>(
  ctx: ServiceContext,
  opts: {
    durable: string;
    subject: string;
    ledger: string;
    parse(data: Record<string, unknown>): T;
    accept(em: EntityManager, events: T[], dispatched: Dispatched[]): Promise<void>;
    /** `accept` adds every outbox event it writes to `dispatched`: the relay is kicked only for what they leave. */
    dispatchesAll?: boolean;
  },
): Promise<RunningConsumer> {
  const { bus } = ctx;
  return runBatchConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: opts.durable,
    filterSubject: bus.subject(opts.subject),
    logger: ctx.logger,
    async handleBatch(msgs) {
      const events: EventEnvelope[] = [];
      const parsed = new Map<string, T>();
      for (const { msg, event } of receivedEvents(msgs)) {
        try {
          parsed.set(event.id, opts.parse(event.data ?? {}));
          events.push(event);
        } catch (err) {
          ctx.logger.error({ err, subject: msg.subject }, "malformed event dropped");
          // No reason text: nats-server 2.9 ignores a +TERM that carries one.
          msg.term();
        }
      }
      const dispatched: Dispatched[] = [];
      const handled = await handleBatchOnce(ctx.orm, opts.ledger, events, async (em, todo) => {
        dispatched.length = 0;
        await opts.accept(
          em,
          todo.map((e) => parsed.get(e.id)!),
          dispatched,
        );
      });
      if (handled.length > 0) {
        const allSent = await publishDispatched(ctx, dispatched);
        if (!allSent || !opts.dispatchesAll) ctx.relay.kick();
      }
    },
  });
}

/** `build_requested` (POST /api/builds) becomes a BUILD action and, with auto-deploy, its DEPLOY. */
export function startBuildRequestConsumer(ctx: ServiceContext): Promise<RunningConsumer> {
  return startIntake<BuildRequested>(ctx, {
    durable: BUILD_REQUESTED_DURABLE,
    subject: subjects.events.buildRequested,
    ledger: "deploy-queue.build-requested",
    parse: parseBuildRequested,
    dispatchesAll: true,
    async accept(em, requests, dispatched) {
      const created = await acceptBuildRequests(em, requests, new Date(), dispatched);
      if (created.length > 0) ctx.logger.info({ actions: created.map((a) => `${a.actionType}:${a.id}`) }, "build requests queued");
    },
  });
}

export const RECONCILE_REQUESTED_DURABLE = "deploy-queue-reconcile-requested";

interface ReconcileRequested {
  app_name: string;
  branch: string;
  group_slug: string;
  requested_by: string;
}

function parseReconcileRequested(data: Record<string, unknown>): ReconcileRequested {
  const { app_name, branch, group_slug, requested_by } = data;
  if (typeof app_name !== "string" || typeof branch !== "string" || typeof group_slug !== "string") {
    throw new Error("reconcile_requested event without app_name, branch and group_slug");
  }
  return { app_name, branch, group_slug, requested_by: typeof requested_by === "string" ? requested_by : "platform" };
}

/**
 * `reconcile_requested` (a visibility flip in apps-builds) becomes a RECONCILE_ROUTING action on
 * the host where the branch runs.
 */
export function startReconcileConsumer(ctx: ServiceContext): Promise<RunningConsumer> {
  return startIntake<ReconcileRequested>(ctx, {
    durable: RECONCILE_REQUESTED_DURABLE,
    subject: subjects.events.reconcileRequested,
    ledger: "deploy-queue.reconcile-requested",
    parse: parseReconcileRequested,
    async accept(em, requests, dispatched) {
      const renamed = await currentSlugs(em, requests.map((r) => r.group_slug));
      for (const r of requests) {
        const groupSlug = renamed.get(r.group_slug) ?? r.group_slug;
        await createAppAction(em, { actionType: "RECONCILE_ROUTING", groupSlug, appName: r.app_name, branch: r.branch }, r.requested_by, new Date(), dispatched);
      }
    },
  });
}

export const PREFLIGHT_REQUESTED_DURABLE = "deploy-queue-preflight-requested";
export const PREFLIGHT_CHECKED_DURABLE = "deploy-queue-preflight-checked";

/** `preflight_requested` and `preflight_checked` (apps-builds) keep the GIT_PREFLIGHT rows. */
export async function startPreflightConsumers(ctx: ServiceContext): Promise<RunningConsumer[]> {
  const requested = await startIntake<PreflightRequested>(ctx, {
    durable: PREFLIGHT_REQUESTED_DURABLE,
    subject: subjects.events.preflightRequested,
    ledger: "deploy-queue.preflight-requested",
    parse: parsePreflightRequested,
    dispatchesAll: true,
    accept: (em, requests) => recordPreflightRequests(em, requests, new Date()),
  });
  const checked = await startIntake<PreflightChecked>(ctx, {
    durable: PREFLIGHT_CHECKED_DURABLE,
    subject: subjects.events.preflightChecked,
    ledger: "deploy-queue.preflight-checked",
    parse: parsePreflightChecked,
    dispatchesAll: true,
    accept: (em, checks) => recordPreflightChecks(em, checks, new Date()),
  });
  return [requested, checked];
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

export function startPeriodicJobs(ctx: ServiceContext, opts: { orphanedAfterMs: number }): { stop(): Promise<void> } {
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
      const failed = await ctx.write((em) => failOrphanedActions(em, new Date(), opts.orphanedAfterMs));
      if (failed.length > 0) ctx.logger.warn({ actions: failed.map((a) => a.id) }, "actions of silent agents failed");
    } catch (err) {
      ctx.logger.warn({ err }, "orphan check failed");
    }
  });
  const prune = every(PRUNE_INTERVAL_MS, async () => {
    try {
      const pruned = await ctx.write((em) => pruneTerminal(em, new Date()));
      if (pruned.actions > 0) ctx.logger.info(pruned, "pruned terminal queue rows");
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
