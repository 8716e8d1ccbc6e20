import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { context, propagation, trace, SpanKind, type SpanContext } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import pg from "pg";
import { AckPolicy } from "@nats-io/jetstream";
import type { Logger } from "@platform/logger";
import { enqueueEvent, openDatabase, type MikroORM } from "@platform/db";
import { createTestDatabase, deleteBusStreams, dropDatabase, testNatsUrl, uniquePrefix } from "@platform/testing";
import {
  ACK_WAIT_MS,
  connectBus,
  handleBatchOnce,
  handleOnce,
  receivedEvents,
  LEDGER_RETENTION_MS,
  maxEventBytes,
  pruneLedger,
  runBatchConsumer,
  runConsumer,
  startOutboxRelay,
  subjects,
  subscribe,
  type Bus,
  type EventEnvelope,
  type JsMsg,
  type OutboxRelay,
  type RunningConsumer,
} from "../src/index.ts";

// An in-process tracer, so the trace context has something to carry.
const exporter = new InMemorySpanExporter();
const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
propagation.setGlobalPropagator(new W3CTraceContextPropagator());
trace.setGlobalTracerProvider(provider);
const testTracer = trace.getTracer("bus-test");

/** A logger that keeps the warnings the bus reports. */
function recordingLogger() {
  const warnings: string[] = [];
  const logger = {
    warn: (_obj: unknown, msg?: string) => void warnings.push(msg ?? ""),
    info: () => undefined,
    error: () => undefined,
    debug: () => undefined,
    trace: () => undefined,
    fatal: () => undefined,
  } as unknown as Logger;
  return { logger, warnings };
}

const prefix = uniquePrefix("tbus");
const streamName = `${prefix}_EVENTS`;
const { logger, warnings } = recordingLogger();
let databaseUrl: string;
let orm: MikroORM;
let bus: Bus;
let db: pg.Client;
const stoppers: Array<() => Promise<void>> = [];

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  orm = await openDatabase({ url: databaseUrl, schema: "bus_test", entities: [], migrations: [] });
  db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
  bus = await connectBus({ url: testNatsUrl(), name: "bus-test", prefix, logger });
});

afterAll(async () => {
  for (const stop of stoppers.reverse()) await stop().catch(() => undefined);
  await bus?.close();
  await orm?.close(true);
  await db?.end().catch(() => undefined);
  if (databaseUrl) await dropDatabase(databaseUrl);
  await deleteBusStreams(prefix);
  await provider.shutdown();
  trace.disable();
  propagation.disable();
  context.disable();
});

function relay(pollMs = 60_000): OutboxRelay {
  const r = startOutboxRelay({ orm, bus, logger, pollMs });
  stoppers.push(() => r.stop());
  return r;
}

async function consumer(durable: string, subject: string, handle: (msg: JsMsg) => Promise<void>): Promise<RunningConsumer> {
  const c = await runConsumer({ bus, stream: streamName, durable, filterSubject: bus.subject(subject), logger, handle });
  stoppers.push(() => c.stop());
  return c;
}

/** Commits one event through the outbox and returns its id. */
function commitEvent(subject: string, payload: Record<string, unknown>): Promise<string> {
  return orm.em.fork().transactional(async (em) => enqueueEvent(em, subject, payload));
}

/** Messages the events stream holds on one (unprefixed) subject. */
async function countOn(subject: string): Promise<number> {
  const full = bus.subject(subject);
  const info = await bus.jsm.streams.info(streamName, { subjects_filter: full });
  return info.state.subjects?.[full] ?? 0;
}

const eventsIn = (msgs: JsMsg[]) => receivedEvents(msgs).map((r) => r.event);

/** Whether the event's row is still in the outbox, waiting to be published. */
async function pending(id: string): Promise<boolean> {
  const r = await db.query("select 1 from bus_test.outbox where id = $1", [id]);
  return r.rowCount === 1;
}

describe("streams", () => {
  it("declares the prefixed streams with a duplicate window, and again without harm", async () => {
    const info = await bus.jsm.streams.info(streamName);
    expect(info.config.subjects).toEqual([`${prefix}.events.>`]);
    expect(info.config.duplicate_window).toBe(120_000_000_000);
    const work = await bus.jsm.streams.info(`${prefix}_WORK`);
    expect(work.config.subjects).toEqual([`${prefix}.work.>`]);
    const again = await connectBus({ url: testNatsUrl(), name: "bus-test-2", prefix, logger });
    await again.close();
    expect(bus.subject(subjects.work.host("h1"))).toBe(`${prefix}.work.host.h1`);
    const ack = await bus.js.publish(bus.subject(subjects.work.host("h1")), "{}");
    expect(ack.stream).toBe(`${prefix}_WORK`);
  });
});

describe("outbox relay", () => {
  let firstId: string;
  const subject = subjects.events.groupCreated;

  it("publishes a committed event exactly once, with Nats-Msg-Id = event id and the trace context", async () => {
    let request: SpanContext | undefined;
    firstId = await testTracer.startActiveSpan("POST /api/groups", async (span) => {
      request = span.spanContext();
      try {
        return await commitEvent(subject, { slug: "g1" });
      } finally {
        span.end();
      }
    });
    expect(await countOn(subject)).toBe(0);
    const r = relay();
    expect(await r.flush()).toBeGreaterThanOrEqual(1);
    expect(await countOn(subject)).toBe(1);

    const stored = await bus.jsm.streams.getMessage(streamName, { last_by_subj: bus.subject(subject) });
    expect(stored).not.toBeNull();
    expect(stored!.header.get("Nats-Msg-Id")).toBe(firstId);
    expect(stored!.header.get("traceparent")).toBe(`00-${request!.traceId}-${request!.spanId}-01`);
    expect(stored!.json()).toEqual({ id: firstId, data: { slug: "g1" } });
    expect(await pending(firstId)).toBe(false);

    // Nothing is left to publish; the stream still holds one message.
    expect(await r.flush()).toBe(0);
    expect(await countOn(subject)).toBe(1);
    await r.stop();
  });

  it("keeps the event id apart from a payload that has an id of its own", async () => {
    const eventId = await commitEvent(subjects.events.credentialRevoked, { kind: "api_key", id: "key-1" });
    const r = relay();
    await r.flush();
    const stored = await bus.jsm.streams.getMessage(streamName, { last_by_subj: bus.subject(subjects.events.credentialRevoked) });
    expect(stored!.json()).toEqual({ id: eventId, data: { kind: "api_key", id: "key-1" } });
    expect(eventId).not.toBe("key-1");
    await r.stop();
  });

  it("drops a repeated publish of the same row within the duplicate window", async () => {
    // A relay that published and then died before deleting the row.
    await db.query("insert into bus_test.outbox (id, subject, payload, headers) values ($1, $2, $3, '{}')", [firstId, subject, { slug: "g1" }]);
    const r = relay();
    await r.flush();
    expect(await pending(firstId)).toBe(false);
    expect(await countOn(subject)).toBe(1);
    await r.stop();
  });

  it("publishes a batch in commit order", async () => {
    const s = "events.test.ordered";
    const ids: string[] = [];
    for (let n = 0; n < 20; n++) ids.push(await commitEvent(s, { n }));
    const r = relay();
    expect(await r.flush()).toBeGreaterThanOrEqual(20);
    const seen: number[] = [];
    const info = await bus.jsm.streams.info(streamName, { subjects_filter: bus.subject(s) });
    for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
      const m = await bus.jsm.streams.getMessage(streamName, { seq }).catch(() => null);
      if (m?.subject === bus.subject(s)) seen.push((m.json<{ data: { n: number } }>()).data.n);
    }
    expect(seen).toEqual([...Array(20).keys()]);
    for (const id of ids) expect(await pending(id)).toBe(false);
    await r.stop();
  });

  it("drops an event too large for the bus instead of holding back the ones after it", async () => {
    const s = "events.test.sizes";
    const huge = await commitEvent(s, { blob: "x".repeat(maxEventBytes(bus) + 1) });
    const after = await commitEvent(s, { n: 1 });
    const r = relay();
    await r.flush();
    expect(await pending(huge)).toBe(false);
    expect(await pending(after)).toBe(false);
    const stored = await bus.jsm.streams.getMessage(streamName, { last_by_subj: bus.subject(s) });
    expect(stored!.json()).toEqual({ id: after, data: { n: 1 } });
    expect(await countOn(s)).toBe(1);
    await r.stop();
  });

  it("keeps the whole batch when a publish fails, and sends it once JetStream takes it", async () => {
    // Nothing stores `nostream.*` yet: that publish has no responder, so the batch rolls back.
    const okId = await commitEvent("events.test.before_failure", { n: 1 });
    const badId = await commitEvent("nostream.test", { n: 2 });
    const r = relay();
    await r.flush();
    expect(await pending(okId)).toBe(true);
    expect(await pending(badId)).toBe(true);
    await bus.jsm.streams.add({ name: `${prefix}_NOSTREAM`, subjects: [bus.subject("nostream.>")] });
    try {
      await r.flush();
      expect(await pending(okId)).toBe(false);
      expect(await pending(badId)).toBe(false);
      expect(await countOn("events.test.before_failure")).toBe(1);
    } finally {
      await bus.jsm.streams.delete(`${prefix}_NOSTREAM`);
    }
    await r.stop();
  });

  it("publishes an event committed while no relay ran once a relay starts", async () => {
    const s = "events.test.orphan";
    const id = await commitEvent(s, { n: 1 });
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await countOn(s)).toBe(0);
    expect(await pending(id)).toBe(true);
    const r = relay(60_000); // never kicked, never flushed: its start alone must pick the row up
    await expect.poll(() => countOn(s), { timeout: 10_000, interval: 100 }).toBe(1);
    await expect.poll(() => pending(id), { timeout: 5_000, interval: 100 }).toBe(false);
    await r.stop();
    const stored = await bus.jsm.streams.getMessage(streamName, { last_by_subj: bus.subject(s) });
    expect(stored!.header.get("Nats-Msg-Id")).toBe(id);
  });

  it("publishes an event whose writer never kicked the relay, on the next poll", async () => {
    const s = "events.test.unkicked";
    const r = relay(300);
    await new Promise((resolve) => setTimeout(resolve, 100));
    const id = await commitEvent(s, { n: 2 });
    await expect.poll(() => countOn(s), { timeout: 10_000, interval: 100 }).toBe(1);
    await expect.poll(() => pending(id), { timeout: 5_000, interval: 100 }).toBe(false);
    await r.stop();
  });

  it("publishes nothing for a rolled-back transaction", async () => {
    const s = "events.test.rolled_back";
    const r = relay();
    await r.flush();
    await expect(
      orm.em.fork().transactional(async (em) => {
        enqueueEvent(em, s, { n: 3 });
        await em.flush();
        throw new Error("abort");
      }),
    ).rejects.toThrow("abort");
    expect(await r.flush()).toBe(0);
    const rows = await db.query("select 1 from bus_test.outbox where subject = $1", [s]);
    expect(rows.rowCount).toBe(0);
    expect(await countOn(s)).toBe(0);
    await r.stop();
  });

  it("publishes many events, more than one batch, in commit order", async () => {
    const s = "events.test.many";
    const ids: string[] = [];
    for (let batch = 0; batch < 3; batch++) {
      ids.push(
        ...(await orm.em.fork().transactional(async (em) =>
          Array.from({ length: 90 }, (_, i) => enqueueEvent(em, s, { i: batch * 90 + i })),
        )),
      );
    }
    const r = relay();
    expect(await r.flush()).toBe(270);
    await r.stop();
    expect(await countOn(s)).toBe(270);
    const seen: string[] = [];
    const ordered = await bus.js.consumers.get(streamName, { filter_subjects: bus.subject(s) });
    const messages = await ordered.fetch({ max_messages: 270, expires: 5_000 });
    for await (const m of messages) {
      seen.push(m.json<EventEnvelope>().id);
      if (seen.length === 270) break;
    }
    expect(seen).toEqual(ids);
  });
});

describe("consumers", () => {
  it("runs the handler once for an event delivered twice", async () => {
    const s = "events.test.once";
    const handled: EventEnvelope[] = [];
    const outcomes: boolean[] = [];
    await consumer("once", s, async (msg) => {
      outcomes.push(
        await handleOnce(orm, "once", msg, async (em, event) => {
          handled.push(event);
          enqueueEvent(em, "events.test.once_followup", { about: event.id });
        }),
      );
    });
    const payload = JSON.stringify({ id: "evt-once-1", data: { app: "web" } });
    await bus.js.publish(bus.subject(s), payload, { msgID: "copy-1" });
    await bus.js.publish(bus.subject(s), payload, { msgID: "copy-2" });
    await expect.poll(() => outcomes.length, { timeout: 10_000, interval: 50 }).toBe(2);
    expect(outcomes).toEqual([true, false]);
    expect(handled).toEqual([{ id: "evt-once-1", data: { app: "web" } }]);
    const ledger = await db.query("select consumer, event_id from bus_test.processed_events where event_id = 'evt-once-1'");
    expect(ledger.rows).toEqual([{ consumer: "once", event_id: "evt-once-1" }]);
    // The handler's write committed with the claim, once.
    const followups = await db.query("select payload from bus_test.outbox where subject = 'events.test.once_followup'");
    expect(followups.rows).toEqual([{ payload: { about: "evt-once-1" } }]);
    // Both copies were acknowledged.
    await expect
      .poll(async () => {
        const info = await bus.jsm.consumers.info(streamName, "once");
        return info.num_ack_pending + info.num_pending;
      }, { timeout: 5_000, interval: 100 })
      .toBe(0);
  });

  it("redelivers a message whose handler threw, and the retry succeeds", async () => {
    const s = "events.test.flaky";
    let attempts = 0;
    const redelivered: boolean[] = [];
    const handled: string[] = [];
    await consumer("flaky", s, async (msg) => {
      attempts++;
      redelivered.push(msg.redelivered);
      const event = msg.json<EventEnvelope>();
      const ran = await handleOnce(orm, "flaky", msg, async () => {
        if (attempts === 1) throw new Error("transient failure");
      });
      // Counted once the handler's transaction committed.
      if (ran) handled.push(event.id);
    });
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "evt-flaky-1", data: {} }), { msgID: "evt-flaky-1" });
    await expect.poll(() => handled.length, { timeout: 15_000, interval: 50 }).toBe(1);
    expect(attempts).toBe(2);
    expect(redelivered).toEqual([false, true]);
    expect(handled).toEqual(["evt-flaky-1"]);
    expect(warnings).toContain("event handler failed; redelivering");
    const ledger = await db.query("select count(*)::int as n from bus_test.processed_events where consumer = 'flaky'");
    expect(ledger.rows[0]).toEqual({ n: 1 });
  });

  it("continues the trace of the request that enqueued the event", async () => {
    const s = "events.test.traced";
    const seen: SpanContext[] = [];
    await consumer("traced", s, async () => {
      const span = trace.getActiveSpan();
      if (span) seen.push(span.spanContext());
    });
    const r = relay();
    let request: SpanContext | undefined;
    await testTracer.startActiveSpan("POST /api/apps", async (span) => {
      request = span.spanContext();
      await commitEvent(s, { n: 1 });
      span.end();
    });
    await r.flush();
    await expect.poll(() => seen.length, { timeout: 10_000, interval: 50 }).toBe(1);
    expect(seen[0]!.traceId).toBe(request!.traceId);
    // The span ends just after the handler returns.
    const find = () => exporter.getFinishedSpans().find((sp) => sp.name === `consume ${bus.subject(s)}`);
    await expect.poll(find, { timeout: 5_000, interval: 20 }).toBeDefined();
    const consumed = find();
    expect(consumed!.kind).toBe(SpanKind.CONSUMER);
    expect(consumed!.spanContext().traceId).toBe(request!.traceId);
    expect(consumed!.parentSpanContext?.spanId).toBe(request!.spanId);
    expect(consumed!.parentSpanContext?.isRemote).toBe(true);
  });

  it("handles as many messages at once as its concurrency, no more, each acknowledged once handled", async () => {
    const s = "events.test.concurrent";
    let now = 0;
    let most = 0;
    const handled: string[] = [];
    const c = await runConsumer({
      bus,
      stream: streamName,
      durable: "concurrent",
      filterSubject: bus.subject(s),
      logger,
      concurrency: 3,
      handle: async (msg) => {
        most = Math.max(most, ++now);
        await new Promise((r) => setTimeout(r, 300));
        now--;
        handled.push(msg.json<EventEnvelope>().id);
      },
    });
    stoppers.push(() => c.stop());
    await Promise.all(Array.from({ length: 7 }, (_, i) => bus.js.publish(bus.subject(s), JSON.stringify({ id: `c${i}`, data: {} }))));
    await expect.poll(() => handled.length, { timeout: 10_000, interval: 20 }).toBe(7);
    expect(most).toBe(3);
    await expect
      .poll(async () => {
        const info = await bus.jsm.consumers.info(streamName, "concurrent");
        return info.num_ack_pending + info.num_pending;
      }, { timeout: 5_000, interval: 100 })
      .toBe(0);
  });

  it("resumes after a restart without handling acknowledged messages again", async () => {
    const s = "events.test.durable";
    const first: string[] = [];
    const c1 = await consumer("durable", s, async (msg) => void first.push(msg.json<EventEnvelope>().id));
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "d1", data: {} }));
    await expect.poll(() => first.length, { timeout: 10_000, interval: 50 }).toBe(1);
    await c1.stop();
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "d2", data: {} }));
    const second: string[] = [];
    await consumer("durable", s, async (msg) => void second.push(msg.json<EventEnvelope>().id));
    await expect.poll(() => second.length, { timeout: 10_000, interval: 50 }).toBe(1);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(first).toEqual(["d1"]);
    expect(second).toEqual(["d2"]);
  });
});

describe("held messages", () => {
  it("hands what a consumer held when it died to the next taker within seconds", async () => {
    const s = "events.test.held_by_dead";
    const other = await connectBus({ url: testNatsUrl(), name: "bus-test-dying", prefix, logger });
    let taken = 0;
    // Takes the message and never settles it, then its connection goes as a killed process's would.
    await runConsumer({ bus: other, stream: streamName, durable: "held-by-dead", filterSubject: bus.subject(s), logger, handle: () => { taken++; return new Promise(() => undefined); } });
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "held-1", data: {} }));
    await expect.poll(() => taken, { timeout: 10_000, interval: 20 }).toBe(1);
    await other.nc.close();
    const handled: boolean[] = [];
    const diedAt = Date.now();
    await consumer("held-by-dead", s, async (msg) => void handled.push(msg.redelivered));
    await expect.poll(() => handled, { timeout: ACK_WAIT_MS * 3, interval: 50 }).toEqual([true]);
    // JetStream's default ack wait (30 s) would have held it far longer.
    expect(Date.now() - diedAt).toBeLessThan(ACK_WAIT_MS * 3);
  });

  it("keeps a message whose handler outlasts the ack wait from being delivered again", async () => {
    const s = "events.test.held_long";
    const deliveries: boolean[] = [];
    const c = await runConsumer({
      bus,
      stream: streamName,
      durable: "held-long",
      filterSubject: bus.subject(s),
      logger,
      ackWaitMs: 1_000,
      handle: async (msg) => {
        deliveries.push(msg.redelivered);
        await new Promise((r) => setTimeout(r, 3_500));
      },
    });
    stoppers.push(() => c.stop());
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "long-1", data: {} }));
    await expect
      .poll(async () => {
        const info = await bus.jsm.consumers.info(streamName, "held-long");
        return deliveries.length > 0 && info.num_ack_pending === 0;
      }, { timeout: 15_000, interval: 100 })
      .toBe(true);
    expect(deliveries).toEqual([false]);
  });

  it("brings a durable made with an older ack wait to the current one", async () => {
    const s = "events.test.old_durable";
    await bus.jsm.consumers.add(streamName, { durable_name: "old-durable", filter_subject: bus.subject(s), ack_policy: AckPolicy.Explicit, ack_wait: 30_000 * 1_000_000 });
    const handled: string[] = [];
    await consumer("old-durable", s, async (msg) => void handled.push(msg.json<EventEnvelope>().id));
    const info = await bus.jsm.consumers.info(streamName, "old-durable");
    expect(info.config.ack_wait).toBe(ACK_WAIT_MS * 1_000_000);
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "old-1", data: {} }));
    await expect.poll(() => handled, { timeout: 10_000, interval: 20 }).toEqual(["old-1"]);
  });
});

describe("batch consumers", () => {
  async function batchConsumer(durable: string, subject: string, handleBatch: (msgs: JsMsg[]) => Promise<void>, maxBatch?: number): Promise<RunningConsumer> {
    const c = await runBatchConsumer({ bus, stream: streamName, durable, filterSubject: bus.subject(subject), logger, handleBatch, maxBatch });
    stoppers.push(() => c.stop());
    return c;
  }

  it("handles a lone message at once, and a burst in fewer batches than messages, in order and once each", async () => {
    const s = "events.test.burst";
    const batches: string[][] = [];
    await batchConsumer(
      "burst",
      s,
      async (msgs) => {
        const handled = await handleBatchOnce(orm, "burst", eventsIn(msgs), async () => {
          // Slow enough that the rest of the burst arrives while this batch is handled.
          await new Promise((r) => setTimeout(r, 30));
        });
        batches.push(handled.map((e) => e.id));
      },
      50,
    );
    await bus.js.publish(bus.subject(s), JSON.stringify({ id: "lone", data: {} }));
    await expect.poll(() => batches.flat(), { timeout: 10_000, interval: 20 }).toEqual(["lone"]);
    expect(batches).toEqual([["lone"]]);

    const ids = Array.from({ length: 120 }, (_, i) => `burst-${i}`);
    await Promise.all(ids.map((id) => bus.js.publish(bus.subject(s), JSON.stringify({ id, data: {} }))));
    await expect.poll(() => batches.flat().length, { timeout: 10_000, interval: 20 }).toBe(121);
    expect(batches.flat()).toEqual(["lone", ...ids]);
    expect(batches.length).toBeLessThan(20);
    expect(Math.max(...batches.map((b) => b.length))).toBeLessThanOrEqual(50);
    await expect
      .poll(async () => {
        const info = await bus.jsm.consumers.info(streamName, "burst");
        return info.num_ack_pending + info.num_pending;
      }, { timeout: 5_000, interval: 100 })
      .toBe(0);
  });

  it("handles an event once whether it comes twice in one batch or again later", async () => {
    const s = "events.test.batch_once";
    const handled: string[] = [];
    await batchConsumer("batch-once", s, async (msgs) => {
      const done = await handleBatchOnce(orm, "batch-once", eventsIn(msgs), async (em, events) => {
        for (const e of events) enqueueEvent(em, "events.test.batch_once_followup", { about: e.id });
      });
      // Counted once their transaction (the follow-up events included) has committed.
      handled.push(...done.map((e) => e.id));
    });
    const payload = (id: string) => JSON.stringify({ id, data: {} });
    await Promise.all([
      bus.js.publish(bus.subject(s), payload("b1"), { msgID: "b1-copy-1" }),
      bus.js.publish(bus.subject(s), payload("b1"), { msgID: "b1-copy-2" }),
      bus.js.publish(bus.subject(s), payload("b2")),
    ]);
    await expect.poll(() => handled.length, { timeout: 10_000, interval: 20 }).toBe(2);
    await bus.js.publish(bus.subject(s), payload("b2"), { msgID: "b2-again" });
    await bus.js.publish(bus.subject(s), payload("b3"));
    await expect.poll(() => handled.length, { timeout: 10_000, interval: 20 }).toBe(3);
    expect(handled).toEqual(["b1", "b2", "b3"]);
    const followups = await db.query("select payload->>'about' as about from bus_test.outbox where subject = 'events.test.batch_once_followup' order by seq");
    expect(followups.rows.map((r) => r.about)).toEqual(["b1", "b2", "b3"]);
  });

  it("redelivers only the message that fails, the rest of its batch is handled", async () => {
    const s = "events.test.batch_poison";
    const handled: string[] = [];
    let poisonAttempts = 0;
    await batchConsumer("batch-poison", s, async (msgs) => {
      const done = await handleBatchOnce(orm, "batch-poison", eventsIn(msgs), async (_em, events) => {
        if (events.some((e) => e.id === "poison") && poisonAttempts++ < 2) throw new Error("cannot handle poison yet");
      });
      // Counted once their transaction (ledger rows included) has committed.
      handled.push(...done.map((e) => e.id));
    });
    await Promise.all(["p1", "poison", "p2"].map((id) => bus.js.publish(bus.subject(s), JSON.stringify({ id, data: {} }))));
    await expect.poll(() => [...handled].sort(), { timeout: 15_000, interval: 50 }).toEqual(["p1", "p2", "poison"]);
    // The good messages were handled without waiting for the poison's redelivery.
    expect(handled.indexOf("poison")).toBe(2);
    const ledger = await db.query("select count(*)::int as n from bus_test.processed_events where consumer = 'batch-poison'");
    expect(ledger.rows[0]).toEqual({ n: 3 });
  });
});

describe("the consumer ledger", () => {
  it("forgets an event once the events stream can no longer deliver it again, and not before", async () => {
    const now = new Date();
    const at = (ms: number) => new Date(now.getTime() - ms);
    await db.query(
      "insert into bus_test.processed_events (consumer, event_id, processed_at) values ('prune', 'gone', $1), ('prune', 'kept', $2), ('prune', 'new', $3)",
      [at(LEDGER_RETENTION_MS + 60_000), at(LEDGER_RETENTION_MS - 60_000), now],
    );
    expect(LEDGER_RETENTION_MS).toBeGreaterThan(subjects.streams().events.maxAgeSeconds * 1000);
    expect(await pruneLedger(orm, now)).toBe(1);
    const left = await db.query<{ event_id: string }>("select event_id from bus_test.processed_events where consumer = 'prune' order by event_id");
    expect(left.rows.map((r) => r.event_id)).toEqual(["kept", "new"]);
  });
});

describe("subscribe", () => {
  it("sees events the relay publishes, and survives a handler that throws", async () => {
    const s = subjects.events.credentialRevoked;
    const received: EventEnvelope[] = [];
    const sub = subscribe(
      bus,
      s,
      (event) => {
        received.push(event);
        if (received.length === 1) throw new Error("handler bug");
      },
      logger,
    );
    stoppers.push(async () => sub.unsubscribe());
    await bus.nc.flush();
    const r = relay();
    const a = await commitEvent(s, { key: "k1" });
    const b = await commitEvent(s, { key: "k2" });
    await r.flush();
    await expect.poll(() => received.length, { timeout: 10_000, interval: 50 }).toBe(2);
    expect(received).toEqual([
      { id: a, data: { key: "k1" } },
      { id: b, data: { key: "k2" } },
    ]);
    expect(warnings).toContain("subscription handler failed");
  });

  it("continues the trace of the request that enqueued the event", async () => {
    const s = "events.test.sub_traced";
    const seen: SpanContext[] = [];
    const sub = subscribe(
      bus,
      s,
      () => {
        const span = trace.getActiveSpan();
        if (span) seen.push(span.spanContext());
      },
      logger,
    );
    stoppers.push(async () => sub.unsubscribe());
    await bus.nc.flush();
    const r = relay();
    let request: SpanContext | undefined;
    await testTracer.startActiveSpan("DELETE /api/keys/k1", async (span) => {
      request = span.spanContext();
      await commitEvent(s, { key: "k1" });
      span.end();
    });
    await r.flush();
    await expect.poll(() => seen.length, { timeout: 10_000, interval: 50 }).toBe(1);
    expect(seen[0]!.traceId).toBe(request!.traceId);
    const find = () => exporter.getFinishedSpans().find((sp) => sp.spanContext().spanId === seen[0]!.spanId);
    await expect.poll(find, { timeout: 5_000, interval: 20 }).toBeDefined();
    const received = find();
    expect(received?.name).toBe(`receive ${bus.subject(s)}`);
    expect(received?.kind).toBe(SpanKind.CONSUMER);
    expect(received?.parentSpanContext?.spanId).toBe(request!.spanId);
    expect(received?.parentSpanContext?.isRemote).toBe(true);
  });
});
