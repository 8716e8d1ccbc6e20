/**
 * LogShipper against the real NATS JetStream: batching per subject, the flush interval, retries
 * with the same message id after a failed publish, and dropping past the buffer bound.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckPolicy, DeliverPolicy, type JsMsg } from "@nats-io/jetstream";
import { connectBus, subjects, type Bus } from "@platform/bus";
import { deleteBusStreams, testNatsUrl, uniquePrefix } from "@platform/testing";
import { LogShipper, decodeLogBatch, subjectToken } from "../src/index.ts";

const prefix = uniquePrefix("tlogship");
const stream = subjects.streams(prefix).logs.name;
let bus: Bus;

beforeAll(async () => {
  bus = await connectBus({ url: testNatsUrl(), name: "logship-test", prefix });
});

afterAll(async () => {
  await bus?.close();
  await deleteBusStreams(prefix);
});

/** Every message on the LOGS stream under `filter`, read with a throwaway consumer. */
async function messages(filter: string, expected: number): Promise<JsMsg[]> {
  const name = uniquePrefix("read");
  await bus.jsm.consumers.add(stream, { name, filter_subject: filter, ack_policy: AckPolicy.None, deliver_policy: DeliverPolicy.All });
  try {
    const consumer = await bus.js.consumers.get(stream, name);
    const out: JsMsg[] = [];
    while (out.length < expected) {
      const batch = await consumer.fetch({ max_messages: expected - out.length, expires: 2000 });
      let got = 0;
      for await (const m of batch) {
        out.push(m);
        got++;
      }
      if (got === 0) break;
    }
    return out;
  } finally {
    await bus.jsm.consumers.delete(stream, name);
  }
}

describe("LogShipper", () => {
  it("publishes batches of at most 100 lines, one subject per app and source, each line with its own id", async () => {
    const shipper = new LogShipper({ bus, defaults: { instance_id: "host-a" }, flushIntervalMs: 50 });
    for (let i = 0; i < 250; i++) expect(shipper.ship({ source: "build", app_name: "batchy", message: `line ${i}` })).toBe(true);
    for (let i = 0; i < 5; i++) shipper.ship({ source: "agent", app_name: "batchy", level: "warning", message: `agent ${i}` });
    shipper.ship({ source: "agent", message: "no app" });
    await shipper.close();
    expect(shipper.stats()).toMatchObject({ buffered: 0, published: 256, dropped: 0, invalid: 0 });

    const builds = await messages(bus.subject(subjects.logs("batchy", "build")), 3);
    const sizes = builds.map((m) => decodeLogBatch(m.data).lines.length);
    expect(sizes.every((n) => n <= 100)).toBe(true);
    expect(sizes.reduce((a, b) => a + b, 0)).toBe(250);
    const lines = builds.flatMap((m) => decodeLogBatch(m.data).lines);
    expect(lines.map((l) => l.message)).toEqual(Array.from({ length: 250 }, (_, i) => `line ${i}`));
    expect(new Set(lines.map((l) => l.id)).size).toBe(250);
    expect(lines[0]).toMatchObject({ instance_id: "host-a", level: "info", source: "build", app_name: "batchy" });

    const agent = await messages(bus.subject(subjects.logs("batchy", "agent")), 1);
    expect(decodeLogBatch(agent[0]!.data).lines.map((l) => l.level)).toEqual(Array(5).fill("warning"));
    const platform = await messages(bus.subject(subjects.logs("", "agent")), 1);
    expect(platform[0]!.subject).toBe(bus.subject("logs._platform.agent"));
  });

  it("flushes on its interval without being asked, and ship() returns at once", async () => {
    const shipper = new LogShipper({ bus, flushIntervalMs: 100 });
    const started = performance.now();
    shipper.ship({ source: "agent", app_name: "ticker", message: "tick" });
    expect(performance.now() - started).toBeLessThan(20);
    await expect.poll(() => shipper.stats().published, { timeout: 3000 }).toBe(1);
    await shipper.close();
  });

  it("keeps a batch whose publish failed and publishes it later with the same message id", async () => {
    // A subject outside every stream: JetStream refuses the publish (no responders).
    const other = uniquePrefix("tlogship");
    const shipper = new LogShipper({ bus: { js: bus.js, subject: (s) => `${other}.${s}` }, flushIntervalMs: 60_000 });
    shipper.ship({ source: "agent", app_name: "later", message: "kept" });
    await shipper.flush();
    expect(shipper.stats()).toMatchObject({ buffered: 1, published: 0 });
    expect(shipper.stats().publishFailures).toBeGreaterThan(0);

    const otherBus = await connectBus({ url: testNatsUrl(), name: "logship-test-2", prefix: other });
    try {
      await shipper.flush();
      expect(shipper.stats()).toMatchObject({ buffered: 0, published: 1 });
      const info = await otherBus.jsm.streams.info(subjects.streams(other).logs.name);
      expect(info.state.messages).toBe(1);
    } finally {
      await shipper.close();
      await otherBus.close();
      await deleteBusStreams(other);
    }
  });

  it("drops and counts lines past its bound instead of growing or blocking", async () => {
    const shipper = new LogShipper({ bus: { js: bus.js, subject: (s) => `${uniquePrefix("nowhere")}.${s}` }, maxBuffered: 10, flushIntervalMs: 60_000 });
    const results = Array.from({ length: 25 }, (_, i) => shipper.ship({ source: "agent", message: `m${i}` }));
    expect(results.filter(Boolean)).toHaveLength(10);
    expect(shipper.dropped).toBe(15);
    expect(shipper.stats().buffered).toBe(10);
    await shipper.close();
    expect(shipper.ship({ source: "agent", message: "after close" })).toBe(false);
  });

  it("tells where lines were dropped once there is room, and lets a producer wait for room instead", async () => {
    const shipper = new LogShipper({ bus, maxBuffered: 10, maxBufferedPerApp: 10, flushIntervalMs: 60_000 });
    const build = { source: "build" as const, app_name: "droppy", build_id: "b0b0b0b0-0000-4000-8000-000000000042" };
    expect(shipper.room()).toBeNull();
    for (let i = 0; i < 4; i++) shipper.ship({ ...build, message: `line ${i}` });
    expect(shipper.room()).toBeNull();
    shipper.ship({ ...build, message: "line 4" });
    // Half full: a producer that can wait is asked to; the other half takes what it still sends.
    expect(shipper.room()).not.toBeNull();
    const results = Array.from({ length: 20 }, (_, i) => shipper.ship({ ...build, message: `line ${i + 5}` }));
    expect(results.filter(Boolean)).toHaveLength(5);
    let roomCame = false;
    const room = shipper.room()!.then(() => (roomCame = true));
    expect(roomCame).toBe(false);
    await shipper.flush();
    await room;
    expect(shipper.ship({ ...build, message: "line 25" })).toBe(true);
    await shipper.close();
    const lines = (await messages(bus.subject(subjects.logs("droppy", "build")), 3)).flatMap((m) => decodeLogBatch(m.data).lines);
    expect(lines.map((l) => l.message)).toEqual([
      ...Array.from({ length: 10 }, (_, i) => `line ${i}`),
      "[15 line(s) dropped here: the agent's log buffer was full]",
      "line 25",
    ]);
    expect(lines[10]).toMatchObject({ level: "warning", build_id: build.build_id, metadata: { dropped_lines: 15 } });
  });

  it("drops a flooding app's lines past its share of the buffer, not another app's", async () => {
    const shipper = new LogShipper({ bus, maxBuffered: 20, maxBufferedPerApp: 5, flushIntervalMs: 60_000 });
    const noisy = { source: "container" as const, group_slug: "acme", app_name: "noisy", branch: "main" };
    const quiet = { source: "container" as const, group_slug: "globex", app_name: "quiet", branch: "main" };
    const flood = Array.from({ length: 30 }, (_, i) => shipper.ship({ ...noisy, message: `flood ${i}` }));
    expect(flood.filter(Boolean)).toHaveLength(5);
    // The same app name on another branch, another app, and the agent's own lines still get in.
    expect(shipper.ship({ ...noisy, branch: "dev", message: "dev line" })).toBe(true);
    expect(Array.from({ length: 3 }, (_, i) => shipper.ship({ ...quiet, message: `quiet ${i}` }))).toEqual([true, true, true]);
    expect(shipper.ship({ source: "agent", message: "agent line" })).toBe(true);
    expect(shipper.stats()).toMatchObject({ buffered: 10, dropped: 25 });
    await shipper.flush();
    // Published, the app has room again: its gap is told first.
    expect(shipper.ship({ ...noisy, message: "after" })).toBe(true);
    await shipper.close();
    const noisyLines = (await messages(bus.subject(subjects.logs("noisy", "container")), 3)).flatMap((m) => decodeLogBatch(m.data).lines);
    expect(noisyLines.filter((l) => l.branch === "main").map((l) => l.message)).toEqual([
      ...Array.from({ length: 5 }, (_, i) => `flood ${i}`),
      "[25 line(s) dropped here: the agent's log buffer was full]",
      "after",
    ]);
    const quietLines = (await messages(bus.subject(subjects.logs("quiet", "container")), 1)).flatMap((m) => decodeLogBatch(m.data).lines);
    expect(quietLines.map((l) => l.message)).toEqual(["quiet 0", "quiet 1", "quiet 2"]);
  });

  it("asks a producer to wait once its app has half its share waiting, while other apps go on", async () => {
    const shipper = new LogShipper({ bus, maxBuffered: 100, maxBufferedPerApp: 8, flushIntervalMs: 60_000 });
    const app = { group_slug: "acme", app_name: "waity", branch: "main" };
    for (let i = 0; i < 4; i++) shipper.ship({ ...app, source: "build", message: `line ${i}` });
    expect(shipper.room({ ...app, app_name: "other" })).toBeNull();
    expect(shipper.room()).toBeNull();
    const room = shipper.room(app);
    expect(room).not.toBeNull();
    await shipper.flush();
    await room;
    expect(shipper.room(app)).toBeNull();
    await shipper.close();
  });

  it("counts and refuses invalid lines", async () => {
    const shipper = new LogShipper({ bus, flushIntervalMs: 60_000 });
    expect(shipper.ship({ source: "agent", message: "x", build_id: "not an id" })).toBe(false);
    expect(shipper.stats()).toMatchObject({ invalid: 1, buffered: 0 });
    await shipper.close();
  });
});

describe("subjectToken", () => {
  it("keeps an app name a single subject token", () => {
    expect(subjectToken("shop")).toBe("shop");
    expect(subjectToken("a.b *>c")).toBe("a_b___c");
    expect(subjectToken(null)).toBe("");
  });
});
