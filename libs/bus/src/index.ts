/**
 * The one bus helper: a NATS connection with JetStream, stream declarations, the outbox relay,
 * and durable idempotent consumers. Trace context rides in message headers.
 */
import { randomUUID } from "node:crypto";
import { connect } from "@nats-io/transport-node";
import { headers as natsHeaders, type MsgHdrs, type NatsConnection, type Subscription } from "@nats-io/nats-core";
import {
  AckPolicy,
  DeliverPolicy,
  jetstream,
  jetstreamManager,
  type JetStreamClient,
  type ConsumerConfig,
  type ConsumerUpdateConfig,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import type { Logger } from "@platform/logger";
import { claimEvents, sqlPool, withClient, type MikroORM, type EntityManager } from "@platform/db";
import { extractTraceContext, injectTraceContext, withSpan, SpanKind } from "@platform/telemetry";
import { events, streams, type StreamDeclaration } from "./subjects.ts";

export * as subjects from "./subjects.ts";
export { pairSafeEnd } from "./text.ts";
export { appNameKey, HOST_LABEL_MAX, sanitizeName } from "./app-names.ts";
export { AGENT_RPC_WORKING_HEADER, AgentSilentError, answerWorking, requestOfAgent } from "./agent-rpc.ts";
export type { NatsConnection, JetStreamClient, JetStreamManager, JsMsg, MsgHdrs, Subscription };

export interface Bus {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  /** Prefix of subjects and streams (empty in production; unique per test run). */
  prefix: string;
  subject(name: string): string;
  close(): Promise<void>;
}

export interface BusOptions {
  url: string;
  name: string;
  prefix?: string;
  logger?: Logger;
}

export async function connectBus(opts: BusOptions): Promise<Bus> {
  const nc = await connect({
    servers: opts.url,
    name: opts.name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
    // Otherwise every request (each JetStream publish among them) builds two Error objects, stack
    // traces and all, in case it fails: a tenth of a service's time under load. Errors still say
    // what failed; they lose only the caller's stack.
    noAsyncTraces: true,
  });
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const prefix = opts.prefix ?? "";
  await declareStreams(jsm, prefix);
  return {
    nc,
    js,
    jsm,
    prefix,
    subject: (name) => (prefix ? `${prefix}.${name}` : name),
    async close() {
      await nc.drain().catch(() => undefined);
    },
  };
}

async function declareStream(jsm: JetStreamManager, s: StreamDeclaration): Promise<void> {
  const config = {
    name: s.name,
    subjects: s.subjects,
    max_age: s.maxAgeSeconds * 1_000_000_000,
    duplicate_window: 2 * 60 * 1_000_000_000,
  };
  try {
    await jsm.streams.info(s.name);
    await jsm.streams.update(s.name, config);
  } catch {
    await jsm.streams.add(config).catch(async (err: unknown) => {
      // Another process declared it first.
      await jsm.streams.info(s.name).catch(() => {
        throw err;
      });
    });
  }
}

export async function declareStreams(jsm: JetStreamManager, prefix = ""): Promise<void> {
  for (const s of Object.values(streams(prefix))) await declareStream(jsm, s);
}

export function traceHeaders(): MsgHdrs {
  const h = natsHeaders();
  injectTraceContext({ set: (k, v) => h.set(k, v), get: (k) => h.get(k) });
  return h;
}

function headersCarrier(h: MsgHdrs | undefined) {
  return { set: (k: string, v: string) => h?.set(k, v), get: (k: string) => h?.get(k) ?? "" };
}

export interface OutboxRelayOptions {
  orm: MikroORM;
  bus: Bus;
  logger: Logger;
  /** Fallback poll interval: rows committed by a process that died before publishing. */
  pollMs?: number;
}

export interface OutboxRelay {
  /** Starts publishing now (after a commit) without waiting for the poll. */
  kick(): void;
  /** Publishes everything pending; resolves when the outbox is empty. */
  flush(): Promise<number>;
  stop(): Promise<void>;
}

const BATCH = 500;

/** Room left in a NATS message for its headers (trace context, Nats-Msg-Id). */
const HEADER_ROOM_BYTES = 8 * 1024;

/**
 * The largest event body the bus takes: the server's max_payload (1 MiB unless configured) less
 * room for headers. Producers keep their events well below it; the relay drops one above it.
 */
export function maxEventBytes(bus: Bus): number {
  return (bus.nc.info?.max_payload ?? 1024 * 1024) - HEADER_ROOM_BYTES;
}

/** The oldest pending rows, locked (other relays skip them) and deleted, for the relay's transaction. */
const CLAIM_BATCH = `delete from outbox where id in (select id from outbox order by seq limit ${BATCH} for update skip locked)
  returning id, seq, subject, payload, headers`;

interface OutboxBatchRow {
  id: string;
  seq: string;
  subject: string;
  payload: object;
  headers: Record<string, string>;
}

/**
 * Publishes committed outbox rows, in commit order within one relay. Rows are locked with SKIP
 * LOCKED, so replicas of a service can relay side by side (their batches may then interleave:
 * consumers must not rely on order across entities). A batch's rows are claimed and deleted in one
 * transaction, committed once JetStream has acknowledged every publish; a publish
 * repeated after a crash carries the same `Nats-Msg-Id` and JetStream drops it as a duplicate.
 * The one row never published is an event larger than the bus takes (maxEventBytes): it is
 * dropped with an error in the log, since a retry could never succeed and would hold back the rest.
 *
 * A batch's publishes go out together on the one connection (so still in order) and are awaited
 * together: under load, rows committed while a batch is in flight make the next batch, and the
 * relay's cost per event shrinks as the rate grows.
 */
export function startOutboxRelay(opts: OutboxRelayOptions): OutboxRelay {
  let stopped = false;
  let running: Promise<number> | null = null;
  let again = false;
  const pool = sqlPool(opts.orm);

  const publishBatch = async (): Promise<number> => {
    return withClient(await pool, async (client) => {
      try {
        // Claimed and deleted in one round trip with the begin; the delete stands only if the commit
        // comes, after every publish was acknowledged. A batch that fails is rolled back whole.
        const [, claimed] = (await client.query(`begin; ${CLAIM_BATCH}`)) as unknown as Array<{ rows: OutboxBatchRow[] }>;
        const rows = claimed!.rows.sort((a, b) => Number(a.seq) - Number(b.seq));
        await Promise.all(
          rows.map(async (row) => {
            const body = JSON.stringify({ id: row.id, data: row.payload });
            const bytes = Buffer.byteLength(body);
            if (bytes > maxEventBytes(opts.bus)) {
              // It could never be published: retried, it would hold back every event after it.
              opts.logger.error({ event_id: row.id, subject: row.subject, bytes, max_bytes: maxEventBytes(opts.bus) }, "outbox event too large for the bus: dropped");
              return;
            }
            const h = natsHeaders();
            for (const [k, v] of Object.entries(row.headers ?? {})) h.set(k, v);
            await opts.bus.js.publish(opts.bus.subject(row.subject), body, { msgID: row.id, headers: h });
          }),
        );
        await client.query("commit");
        return rows.length;
      } catch (err) {
        await client.query("rollback").catch(() => undefined);
        throw err;
      }
    });
  };

  const run = (): Promise<number> => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      let total = 0;
      try {
        do {
          again = false;
          for (let n = BATCH; n === BATCH && !stopped; total += n) n = await publishBatch();
        } while (again && !stopped);
      } catch (err) {
        if (!stopped) opts.logger.warn({ err }, "outbox relay could not publish; will retry");
      } finally {
        running = null;
      }
      return total;
    })();
    return running;
  };

  const timer = setInterval(() => void run(), opts.pollMs ?? 1000);
  void run();
  return {
    kick: () => void run(),
    async flush() {
      let total = 0;
      while (running) total += await running;
      return total + (await run());
    },
    async stop() {
      stopped = true;
      clearInterval(timer);
      await running?.catch(() => undefined);
    },
  };
}

/** What an outbox event looks like on the bus: its own id (the dedupe key) and the payload. */
export interface EventEnvelope {
  id: string;
  data: Record<string, unknown>;
}

/**
 * Publishes an event as an outbox relay would, for a process with no database (an agent): what
 * it tells is lost if the publish fails, so it is only for what is told again or made moot later.
 */
export async function publishEvent(bus: Pick<Bus, "js" | "subject">, subject: string, data: Record<string, unknown>): Promise<void> {
  const id = randomUUID();
  await bus.js.publish(bus.subject(subject), JSON.stringify({ id, data } satisfies EventEnvelope), { msgID: id });
}

export interface ConsumerOptions {
  bus: Bus;
  stream: string;
  durable: string;
  filterSubject: string;
  logger: Logger;
  handle: (msg: JsMsg) => Promise<void>;
  /** How long a message held without a sign of life waits before JetStream redelivers it (default ACK_WAIT_MS). */
  ackWaitMs?: number;
  /**
   * How many messages `runConsumer` handles at once (default 1: one after another, in order).
   * More lets a handler that holds its message for long (running an action) not keep the ones
   * behind it from being looked at.
   */
  concurrency?: number;
  /**
   * Where a durable made now starts: `all` the stream holds (default), or `new` messages only,
   * for a consumer to whom older events mean nothing (an agent installed after them).
   */
  startAt?: "all" | "new";
}

export interface RunningConsumer {
  stop(): Promise<void>;
}

/**
 * A durable pull consumer whose `consume()` loop re-establishes itself after any failure.
 * A handler that throws naks the message with a delay; JetStream redelivers it.
 */
export async function runConsumer(opts: ConsumerOptions): Promise<RunningConsumer> {
  const held = new HeldMessages(opts.ackWaitMs);
  const limit = Math.max(1, opts.concurrency ?? 1);
  const handling = new Set<Promise<void>>();
  const handle = async (msg: JsMsg): Promise<void> => {
    const parent = extractTraceContext(headersCarrier(msg.headers));
    try {
      await withSpan(`consume ${msg.subject}`, { kind: SpanKind.CONSUMER, parent, attributes: { "messaging.system": "nats", "messaging.destination.name": msg.subject } }, () => opts.handle(msg));
      msg.ack();
    } catch (err) {
      opts.logger.warn({ err, subject: msg.subject }, "event handler failed; redelivering");
      msg.nak(1000);
    } finally {
      held.settled([msg]);
    }
  };
  const consumer = await consumeDurably(opts, held, async (msg) => {
    const handled: Promise<void> = handle(msg).finally(() => handling.delete(handled));
    handling.add(handled);
    if (handling.size >= limit) await Promise.race(handling);
  });
  return {
    async stop() {
      await consumer.stop();
      await Promise.all(handling);
      held.close();
    },
  };
}

export interface BatchConsumerOptions extends Omit<ConsumerOptions, "handle"> {
  /** Handles messages together (one transaction, say); throwing redelivers them. */
  handleBatch: (msgs: JsMsg[]) => Promise<void>;
  /** Most messages handled at once (default 256). */
  maxBatch?: number;
}

/**
 * A durable consumer like `runConsumer` whose handler takes what has arrived at once: a lone
 * message is handled as soon as it comes (a batch of one), and messages that arrive while a batch
 * is being handled make the next batch, so a burst costs one transaction per batch rather than
 * one per message. When a batch fails, each of its messages is tried alone, so one bad message
 * is redelivered without holding back the rest.
 */
export async function runBatchConsumer(opts: BatchConsumerOptions): Promise<RunningConsumer> {
  const max = opts.maxBatch ?? 256;
  const held = new HeldMessages(opts.ackWaitMs);
  const pending: JsMsg[] = [];
  let working: Promise<void> | null = null;

  const handle = async (batch: JsMsg[]): Promise<void> => {
    const contexts = batch.map((m) => extractTraceContext(headersCarrier(m.headers)));
    const subject = batch[0]!.subject;
    try {
      await withSpan(
        `consume ${subject}`,
        {
          kind: SpanKind.CONSUMER,
          parent: batch.length === 1 ? contexts[0] : undefined,
          links: batch.length === 1 ? undefined : contexts,
          attributes: { "messaging.system": "nats", "messaging.destination.name": subject, "messaging.batch.message_count": batch.length },
        },
        () => opts.handleBatch(batch),
      );
      for (const m of batch) m.ack();
      held.settled(batch);
    } catch (err) {
      if (batch.length > 1) {
        for (const m of batch) await handle([m]);
        return;
      }
      opts.logger.warn({ err, subject }, "event handler failed; redelivering");
      batch[0]!.nak(1000);
      held.settled(batch);
    }
  };
  // Starts on the next macrotask, by when every message already buffered has been taken in.
  const kick = (): void => {
    working ??= new Promise<void>((resolve) => setImmediate(resolve))
      .then(async () => {
        while (pending.length > 0) await handle(pending.splice(0, max));
      })
      .finally(() => {
        working = null;
        if (pending.length > 0) kick();
      });
  };

  const consumer = await consumeDurably(opts, held, async (msg) => {
    pending.push(msg);
    kick();
    // Two batches waiting: take no more until one is done.
    if (pending.length >= 2 * max) await working;
  }, max);
  return {
    async stop() {
      await consumer.stop();
      while (working) await working;
      held.close();
    },
  };
}

/**
 * How long JetStream waits for the ack of a message it delivered before it hands the message out
 * again. Short, so that what a replica held when it died (a crash, a kill, a host lost) reaches
 * the next taker within seconds; a message still being handled, however long, is kept from
 * redelivery by HeldMessages.
 */
export const ACK_WAIT_MS = 5_000;

/**
 * The messages a consumer has taken and not yet settled (acked, nakked or terminated): each is
 * marked in progress (`working()`) every third of the ack wait, so JetStream redelivers only what
 * a consumer that stopped living held.
 */
export class HeldMessages {
  readonly ackWaitMs: number;
  readonly #msgs = new Set<JsMsg>();
  readonly #timer: NodeJS.Timeout;

  constructor(ackWaitMs = ACK_WAIT_MS) {
    this.ackWaitMs = ackWaitMs;
    this.#timer = setInterval(() => {
      try {
        for (const msg of this.#msgs) msg.working();
      } catch {
        // The connection is closed: what is held is redelivered, as it should be.
      }
    }, ackWaitMs / 3);
    this.#timer.unref();
  }

  taken(msg: JsMsg): void {
    this.#msgs.add(msg);
  }

  settled(msgs: JsMsg[]): void {
    for (const msg of msgs) this.#msgs.delete(msg);
  }

  close(): void {
    clearInterval(this.#timer);
  }
}

/**
 * Creates a durable consumer, or brings one made earlier (by an older release, say) to `config`
 * where JetStream lets a consumer change: its ack wait and how many messages it may hold. Without
 * that a durable would keep the settings it was first made with for ever. Replicas starting
 * together race to create it; the loser finds it made.
 */
export async function ensureDurable(jsm: JetStreamManager, stream: string, config: Partial<ConsumerConfig> & { durable_name: string }): Promise<void> {
  const existing = await jsm.consumers.add(stream, config).then(
    () => null,
    (err: unknown) =>
      jsm.consumers.info(stream, config.durable_name).catch(() => {
        throw err;
      }),
  );
  if (!existing) return;
  const changes: Partial<ConsumerUpdateConfig> = {};
  if (config.ack_wait !== undefined && existing.config.ack_wait !== config.ack_wait) changes.ack_wait = config.ack_wait;
  if (config.max_ack_pending !== undefined && existing.config.max_ack_pending !== config.max_ack_pending) changes.max_ack_pending = config.max_ack_pending;
  if (Object.keys(changes).length > 0) await jsm.consumers.update(stream, config.durable_name, changes);
}

/** The durable consumer and its `consume()` loop, shared by both consumer shapes. */
async function consumeDurably(
  opts: Omit<ConsumerOptions, "handle">,
  held: HeldMessages,
  take: (msg: JsMsg) => Promise<void>,
  buffered = 64,
): Promise<RunningConsumer> {
  const { jsm, js } = opts.bus;
  await ensureDurable(jsm, opts.stream, {
    durable_name: opts.durable,
    filter_subject: opts.filterSubject,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: opts.startAt === "new" ? DeliverPolicy.New : DeliverPolicy.All,
    ack_wait: held.ackWaitMs * 1_000_000,
    max_deliver: -1,
  });
  let stopped = false;
  let current: { close(): Promise<void | Error> } | null = null;
  const loop = (async () => {
    while (!stopped) {
      try {
        const consumer = await js.consumers.get(opts.stream, opts.durable);
        const messages = await consumer.consume({ max_messages: buffered });
        current = messages;
        // stop() may have run while the consumer was being set up.
        if (stopped) {
          void messages.close();
          break;
        }
        for await (const msg of messages) {
          held.taken(msg);
          await take(msg);
          if (stopped) break;
        }
      } catch (err) {
        if (!stopped) {
          opts.logger.warn({ err, durable: opts.durable }, "consumer failed; re-establishing");
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    }
  })();
  return {
    async stop() {
      stopped = true;
      // close() settles once the iterator drains; the loop's own exit is what we wait for.
      void current?.close();
      await loop;
    },
  };
}

/** A message that is an outbox event, parsed once. */
export interface ReceivedEvent {
  msg: JsMsg;
  event: EventEnvelope;
}

/**
 * The outbox events among `msgs`, each parsed once. A message that is not one (no event id) is
 * terminated: redelivering it would never make it one. (No reason text: nats-server 2.9 ignores
 * a +TERM that carries one.)
 */
export function receivedEvents(msgs: JsMsg[]): ReceivedEvent[] {
  const out: ReceivedEvent[] = [];
  for (const msg of msgs) {
    const event = msg.json<EventEnvelope>();
    if (typeof event.id === "string" && event.id) out.push({ msg, event });
    else msg.term();
  }
  return out;
}

/**
 * Runs `handle` at most once per event id for `consumer`: the ledger row and the handler's
 * writes commit together, so a redelivered or duplicated message is acknowledged and dropped.
 */
export async function handleOnce(
  orm: MikroORM,
  consumer: string,
  msg: JsMsg,
  handle: (em: EntityManager, event: EventEnvelope) => Promise<void>,
): Promise<boolean> {
  const events = receivedEvents([msg]).map((r) => r.event);
  return (await handleBatchOnce(orm, consumer, events, (em, [event]) => handle(em, event!))).length > 0;
}

/**
 * `handleOnce` for a batch: one transaction records every event id and runs `handle` with the
 * events not handled before (none is lost: the ledger rows and the handler's writes commit
 * together). Answers the events handled now.
 */
export async function handleBatchOnce(
  orm: MikroORM,
  consumer: string,
  events: EventEnvelope[],
  handle: (em: EntityManager, events: EventEnvelope[]) => Promise<void>,
): Promise<EventEnvelope[]> {
  if (events.length === 0) return [];
  return orm.em.fork().transactional(async (em) => {
    const fresh = await claimEvents(em, consumer, events.map((e) => e.id));
    const todo = events.filter((e) => fresh.delete(e.id));
    if (todo.length > 0) await handle(em, todo);
    return todo;
  });
}

/**
 * How long a consumer's ledger remembers an event: a day past the events stream's age limit, after
 * which no copy of the event can be delivered again.
 */
export const LEDGER_RETENTION_MS = (streams().events.maxAgeSeconds + 24 * 3600) * 1000;

/** Forgets the ledger entries no redelivery can need any more; every service runs it hourly. */
export async function pruneLedger(orm: MikroORM, now: Date = new Date()): Promise<number> {
  const pool = await sqlPool(orm);
  const r = await pool.query({ name: "ledger-prune", text: "delete from processed_events where processed_at < $1", values: [new Date(now.getTime() - LEDGER_RETENTION_MS)] });
  return r.rowCount ?? 0;
}

/** Plain NATS subscription (every replica sees every message), with trace context continued. */
export function subscribe(bus: Bus, subject: string, handle: (data: EventEnvelope) => void | Promise<void>, logger: Logger): Subscription {
  const sub = bus.nc.subscribe(bus.subject(subject));
  void (async () => {
    for await (const m of sub) {
      const parent = extractTraceContext(headersCarrier(m.headers));
      try {
        await withSpan(`receive ${m.subject}`, { kind: SpanKind.CONSUMER, parent, attributes: { "messaging.system": "nats", "messaging.destination.name": m.subject } }, async () => handle(m.json<EventEnvelope>()));
      } catch (err) {
        logger.warn({ err, subject }, "subscription handler failed");
      }
    }
  })();
  return sub;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Ids that travel in events (builds, actions, deployments) are uuids. */
export function isUuid(id: unknown): id is string {
  return typeof id === "string" && UUID.test(id);
}

/** apps-builds' `build_requested` (POST /api/builds), as deploy-queue turns it into actions. */
export interface BuildRequested {
  build_id: string;
  deploy_action_id: string | null;
  app_name: string;
  branch: string;
  group_slug: string;
  tag: string;
  repository: string;
  config_path: string;
  auto_deploy: boolean;
  created_by: string;
  /** When the build was asked for (ISO 8601): the order of builds, however late the event comes. */
  requested_at?: string | null;
  commit_message?: string | null;
  commit_author?: string | null;
  /** The tag serving on the branch when the build was asked for: its auto-deploy's previous_tag. */
  previous_tag?: string | null;
}

function requireText(data: Record<string, unknown>, key: string): string {
  const v = data[key];
  if (typeof v !== "string" || v === "") throw new Error(`build_requested event without ${key}`);
  return v;
}

/** Checks the shape of the event; a malformed event is a bug upstream and fails loudly. */
export function parseBuildRequested(data: Record<string, unknown>): BuildRequested {
  if (!isUuid(data.build_id)) throw new Error("build_requested event without a uuid build_id");
  const deployId = data.deploy_action_id ?? null;
  if (deployId !== null && !isUuid(deployId)) throw new Error("build_requested event with a malformed deploy_action_id");
  const optional = (k: string) => (typeof data[k] === "string" && data[k] !== "" ? (data[k] as string) : null);
  const requestedAt = optional("requested_at");
  return {
    build_id: data.build_id,
    deploy_action_id: deployId,
    app_name: requireText(data, "app_name"),
    branch: requireText(data, "branch"),
    group_slug: requireText(data, "group_slug"),
    tag: requireText(data, "tag"),
    repository: requireText(data, "repository"),
    config_path: typeof data.config_path === "string" && data.config_path ? data.config_path : "platform.yaml",
    auto_deploy: data.auto_deploy === true,
    created_by: typeof data.created_by === "string" ? data.created_by : "system",
    requested_at: requestedAt && !Number.isNaN(Date.parse(requestedAt)) ? requestedAt : null,
    commit_message: optional("commit_message"),
    commit_author: optional("commit_author"),
    previous_tag: optional("previous_tag"),
  };
}

/** identity's `group_renamed`, as the services, gateways and agents that keep group slugs read it. */
export interface GroupRenamed {
  group_id: string;
  slug: string;
  previous_slug: string;
}

/** identity's `group_deleted`: every slug the group had (its last one and those it was renamed away from). */
export interface GroupDeleted {
  group_id: string;
  slugs: string[];
  /** When the group was deleted; absent from events written before it was added. */
  deleted_at?: Date;
}

/**
 * apps-builds' `builds_deleted`: a branch's builds deleted, by a purge or with the branch itself
 * (`branchDeleted`); what other services keep of them goes too.
 */
export interface BuildsDeleted {
  groupSlug: string;
  appName: string;
  branch: string;
  buildIds: string[];
  branchDeleted: boolean;
  /** When apps-builds deleted them (`deleted_at`); the time the event is handled for an event without it. */
  deletedAt: Date;
}

/**
 * A required text field of an event's data, for its parser: an event without it is malformed,
 * and consumeEvent terminates it rather than have it redelivered.
 */
export function eventText(event: string, data: Record<string, unknown>, key: string): string {
  const v = data[key];
  if (typeof v !== "string" || v === "") throw new Error(`${event}: ${key} must be a non-empty string`);
  return v;
}

export function parseBuildsDeleted(data: Record<string, unknown>): BuildsDeleted {
  const text = (key: string) => eventText("builds_deleted", data, key);
  const ids = data.build_ids;
  if (!Array.isArray(ids) || !ids.every((id) => typeof id === "string")) throw new Error("builds_deleted: build_ids must be a list of strings");
  const deletedAt = typeof data.deleted_at === "string" ? new Date(data.deleted_at) : new Date();
  if (Number.isNaN(deletedAt.getTime())) throw new Error("builds_deleted: deleted_at must be a timestamp");
  return { groupSlug: text("group_slug"), appName: text("app_name"), branch: text("branch"), buildIds: ids as string[], branchDeleted: data.branch_deleted === true, deletedAt };
}

export function parseGroupRenamed(data: Record<string, unknown>): GroupRenamed {
  const { group_id, slug, previous_slug } = data;
  if (typeof group_id !== "string" || typeof slug !== "string" || !slug || typeof previous_slug !== "string" || !previous_slug) {
    throw new Error("group_renamed event without group_id, slug and previous_slug");
  }
  return { group_id, slug, previous_slug };
}

export function parseGroupDeleted(data: Record<string, unknown>): GroupDeleted {
  const { group_id, slugs, deleted_at } = data;
  if (typeof group_id !== "string" || !Array.isArray(slugs) || slugs.length === 0 || !slugs.every((s) => typeof s === "string" && s)) {
    throw new Error("group_deleted event without group_id and slugs");
  }
  if (deleted_at === undefined) return { group_id, slugs };
  const at = typeof deleted_at === "string" ? new Date(deleted_at) : new Date(NaN);
  if (Number.isNaN(at.getTime())) throw new Error("group_deleted event with a deleted_at that is not a timestamp");
  return { group_id, slugs, deleted_at: at };
}

export interface GroupEventConsumerOptions {
  bus: Bus;
  orm: MikroORM;
  logger: Logger;
  /** Names the durables (`<service>-group-renamed`) and the ledger (`<service>.group-renamed`). */
  service: string;
  renamed(em: EntityManager, event: GroupRenamed): Promise<void>;
  /** For a service that drops what it keeps of a deleted group. */
  deleted?(em: EntityManager, event: GroupDeleted): Promise<void>;
}

export interface EventConsumerOptions<T> {
  bus: Bus;
  orm: MikroORM;
  logger: Logger;
  /** Names the durable (`<service>-<name>`) and the ledger (`<service>.<name>`). */
  service: string;
  name: string;
  subject: string;
  /** Reads the event's data; throws when it is malformed. */
  parse(data: Record<string, unknown>): T;
  handle(em: EntityManager, event: T): Promise<void>;
}

/**
 * A durable consumer of one domain event: each event handled once, its writes committed with the
 * ledger row (handleOnce). A malformed event is terminated: redelivering it would never make it valid.
 */
export function consumeEvent<T>(opts: EventConsumerOptions<T>): Promise<RunningConsumer> {
  const { bus, logger } = opts;
  return runConsumer({
    bus,
    stream: streams(bus.prefix).events.name,
    durable: `${opts.service}-${opts.name}`,
    filterSubject: bus.subject(opts.subject),
    logger,
    async handle(msg) {
      let event: T;
      try {
        event = opts.parse(msg.json<EventEnvelope>().data ?? {});
      } catch (err) {
        logger.error({ err, subject: msg.subject }, "malformed event dropped");
        msg.term();
        return;
      }
      await handleOnce(opts.orm, `${opts.service}.${opts.name}`, msg, (em) => opts.handle(em, event));
    },
  });
}

/** The consumers of a service that keeps rows under group slugs (consumeEvent for each group event). */
export async function consumeGroupEvents(opts: GroupEventConsumerOptions): Promise<RunningConsumer> {
  const start = <T>(name: string, subject: string, parse: (data: Record<string, unknown>) => T, handle: (em: EntityManager, event: T) => Promise<void>) =>
    consumeEvent({ bus: opts.bus, orm: opts.orm, logger: opts.logger, service: opts.service, name, subject, parse, handle });
  const consumers = [await start("group-renamed", events.groupRenamed, parseGroupRenamed, opts.renamed)];
  if (opts.deleted) consumers.push(await start("group-deleted", events.groupDeleted, parseGroupDeleted, opts.deleted));
  return {
    async stop() {
      for (const c of consumers) await c.stop();
    },
  };
}
