/**
 * LogShipper: how an agent ships log lines. `ship()` validates a line, stamps it with an id and
 * buffers it, and returns at once; a flush every 200 ms (or as soon as 100 lines wait) publishes
 * the buffer as batches, one JetStream message (a JSON array) per `logs.<app>.<source>` subject
 * and at most 100 lines or 512 KiB. A publish that fails keeps its batch, with the same message
 * id, for the next flush; JetStream drops the copy if the first attempt had landed after all,
 * and health-aggregator stores each line id once in any case. Past `maxBuffered` waiting lines,
 * new lines are dropped and counted: logging never blocks or exhausts the agent. One app (a
 * group's app and branch) may have at most `maxBufferedPerApp` lines waiting: every tenant on the
 * host shares the buffer, and one flooding its output must lose its own lines, not the others'.
 */
import { randomUUID } from "node:crypto";
import { subjects, type Bus } from "@platform/bus";
import type { Logger } from "@platform/logger";
import { validateLogLine, type LogLevel, type LogLine, type ValidLogLine } from "./line.ts";

/** What a caller hands to `ship()`: a line whose `ts` defaults to now and `level` to info; ids are the shipper's. */
export type LogLineInput = Omit<LogLine, "id" | "ts" | "level"> & { ts?: string | Date; level?: LogLevel };

export interface LogShipperOptions {
  /** Only `js` and `subject` are used. */
  bus: Pick<Bus, "js" | "subject">;
  /** Fields every line gets unless it sets them, e.g. `{ instance_id: hostId }`. */
  defaults?: Partial<Pick<LogLineInput, "instance_id" | "app_name" | "branch" | "group_slug" | "service_name">>;
  /** Publish at least this often (default 200 ms). */
  flushIntervalMs?: number;
  /** Publish as soon as this many lines wait, and at most this many per message (default 100). */
  batchLines?: number;
  /** Lines that may wait (default 10 000); beyond, new lines are dropped and counted. */
  maxBuffered?: number;
  /** Lines of one app (group, app, branch) that may wait (default a quarter of maxBuffered). */
  maxBufferedPerApp?: number;
  /** Largest message payload (default 512 KiB, under the NATS default of 1 MiB). */
  maxBatchBytes?: number;
  logger?: Logger;
}

export interface LogShipperStats {
  /** Lines waiting to be published. */
  buffered: number;
  /** Lines JetStream acknowledged. */
  published: number;
  /** Lines refused because the buffer was full. */
  dropped: number;
  /** Lines refused by validation. */
  invalid: number;
  /** Publish attempts that failed (their lines stay buffered). */
  publishFailures: number;
}

interface Batch {
  subject: string;
  msgId: string;
  lines: ValidLogLine[];
  body: string;
}

export class LogShipper {
  readonly #bus: Pick<Bus, "js" | "subject">;
  readonly #defaults: LogShipperOptions["defaults"];
  readonly #batchLines: number;
  readonly #maxBuffered: number;
  readonly #maxPerApp: number;
  readonly #maxBatchBytes: number;
  readonly #logger: Logger | undefined;
  readonly #timer: NodeJS.Timeout;
  /** Lines not yet in a batch. */
  #pending: ValidLogLine[] = [];
  /** Batches formed but not yet acknowledged (retried first, with the same message id). */
  #batches: Batch[] = [];
  #batchedLines = 0;
  #flushing: Promise<void> | null = null;
  #again = false;
  #closed = false;
  #lastFailureLog = 0;
  #stats = { published: 0, dropped: 0, invalid: 0, publishFailures: 0 };
  /** Lines dropped while the buffer was full, per stream of lines (see #dropKey), told once there is room. */
  #droppedBy = new Map<string, { line: LogLineInput; count: number }>();
  /** Lines waiting per app (see appKey); lines of no app are not counted. */
  #byApp = new Map<string, number>();
  /** Waiters for room (see room()), each for the app it produces lines of, if any. */
  #roomWaiters: Array<{ app: string | null; wake: () => void }> = [];

  constructor(opts: LogShipperOptions) {
    this.#bus = opts.bus;
    this.#defaults = opts.defaults;
    this.#batchLines = opts.batchLines ?? 100;
    this.#maxBuffered = opts.maxBuffered ?? 10_000;
    this.#maxPerApp = opts.maxBufferedPerApp ?? Math.max(1, Math.floor(this.#maxBuffered / 4));
    this.#maxBatchBytes = opts.maxBatchBytes ?? 512 * 1024;
    this.#logger = opts.logger;
    this.#timer = setInterval(() => void this.flush(), opts.flushIntervalMs ?? 200);
    this.#timer.unref();
  }

  /**
   * Buffers one line; never waits. False when the line was dropped (buffer full, shipper closed)
   * or refused by validation.
   */
  ship(input: LogLineInput): boolean {
    const app = this.#appKeyOf(input);
    if (this.#closed || this.buffered >= this.#maxBuffered || this.#appFull(app)) {
      this.#stats.dropped++;
      if (!this.#closed) this.#noteDropped(input);
      return false;
    }
    if (this.#droppedBy.size > 0) this.#tellDropped();
    return this.#accept(input, app);
  }

  /**
   * Null while the buffer, and the share of it the producer's app may take (`of`), are less than
   * half full; otherwise a promise that resolves once both are a quarter full again. A producer
   * that can wait (a build command's output: its pipe fills and the command waits on its writes)
   * waits on it, and the half left over takes what it had already read (a pipe's chunk of lines),
   * so none of its lines is dropped.
   */
  room(of?: AppOfLine): Promise<void> | null {
    const app = of ? appKey(of) : null;
    if (this.#closed || (this.buffered < this.#maxBuffered / 2 && (app === null || this.#waitingOf(app) < this.#maxPerApp / 2))) return null;
    return new Promise((resolve) => this.#roomWaiters.push({ app, wake: resolve }));
  }

  /** The app (appKey) of a line as it will be stamped: its own fields, else the shipper's defaults. */
  #appKeyOf(input: LogLineInput): string | null {
    const d = this.#defaults;
    const field = <K extends keyof AppOfLine>(k: K) => (input[k] !== undefined ? input[k] : d?.[k]);
    return appKey({ group_slug: field("group_slug"), app_name: field("app_name"), branch: field("branch") });
  }

  #waitingOf(app: string): number {
    return this.#byApp.get(app) ?? 0;
  }

  #appFull(app: string | null): boolean {
    return app !== null && this.#waitingOf(app) >= this.#maxPerApp;
  }

  #count(app: string | null, by: 1 | -1): void {
    if (app === null) return;
    const n = this.#waitingOf(app) + by;
    if (n > 0) this.#byApp.set(app, n);
    else this.#byApp.delete(app);
  }

  /** `app`: the line's appKeyOf, counted against its app's share once the line is buffered. */
  #accept(input: LogLineInput, app: string | null): boolean {
    const result = validateLogLine({
      ...this.#defaults,
      ...stripUndefined(input),
      id: randomUUID(),
      ts: input.ts ?? new Date().toISOString(),
      level: input.level ?? "info",
    });
    if (!result.ok) {
      this.#stats.invalid++;
      this.#logger?.warn({ error: result.error }, "log line refused");
      return false;
    }
    this.#pending.push(result.line);
    this.#count(app, 1);
    if (this.#pending.length >= this.#batchLines) void this.flush();
    return true;
  }

  /** Which stream of lines a dropped line belongs to: where its marker goes. */
  #dropKey(input: LogLineInput): string {
    return JSON.stringify([input.source, input.app_name, input.branch, input.group_slug, input.service_name, input.build_id, input.deployment_id, input.action_id]);
  }

  #noteDropped(input: LogLineInput): void {
    const key = this.#dropKey(input);
    const seen = this.#droppedBy.get(key);
    if (seen) seen.count++;
    else this.#droppedBy.set(key, { line: input, count: 1 });
  }

  /** A line in each stream that lost lines, where they were: a reader sees the gap. */
  #tellDropped(): void {
    for (const [key, { line, count }] of this.#droppedBy) {
      if (this.buffered >= this.#maxBuffered) return;
      const app = this.#appKeyOf(line);
      if (this.#appFull(app)) continue;
      this.#droppedBy.delete(key);
      this.#accept({
        ...line,
        ts: undefined,
        level: "warning",
        message: `[${count} line(s) dropped here: the agent's log buffer was full]`,
        metadata: { ...line.metadata, dropped_lines: count },
      }, app);
    }
  }

  #wakeRoomWaiters(): void {
    if (this.#roomWaiters.length === 0 || (!this.#closed && this.buffered > this.#maxBuffered / 4)) return;
    const waiters = this.#roomWaiters;
    this.#roomWaiters = [];
    for (const waiter of waiters) {
      if (this.#closed || waiter.app === null || this.#waitingOf(waiter.app) <= this.#maxPerApp / 4) waiter.wake();
      else this.#roomWaiters.push(waiter);
    }
  }

  /** Lines waiting to be published. */
  get buffered(): number {
    return this.#pending.length + this.#batchedLines;
  }

  /** Lines dropped because the buffer was full or the shipper closed. */
  get dropped(): number {
    return this.#stats.dropped;
  }

  stats(): LogShipperStats {
    return { buffered: this.buffered, ...this.#stats };
  }

  /**
   * Publishes what waits. Resolves when this attempt is over: everything published, or a
   * publish failed and its batch stays buffered for the next flush.
   */
  flush(): Promise<void> {
    if (this.#flushing) {
      this.#again = true;
      return this.#flushing;
    }
    this.#flushing = (async () => {
      try {
        do {
          this.#again = false;
          if (!(await this.#publishAll())) break;
        } while (this.#again);
      } finally {
        this.#flushing = null;
      }
    })();
    return this.#flushing;
  }

  /** Stops the timer and publishes what waits (once); later lines are dropped. */
  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#wakeRoomWaiters();
    await this.flush();
  }

  /** False when a publish failed (stop for now; the next flush retries). */
  async #publishAll(): Promise<boolean> {
    this.#formBatches();
    while (this.#batches.length > 0) {
      const batch = this.#batches[0]!;
      try {
        await this.#bus.js.publish(batch.subject, batch.body, { msgID: batch.msgId });
      } catch (err) {
        this.#stats.publishFailures++;
        if (Date.now() - this.#lastFailureLog > 10_000) {
          this.#lastFailureLog = Date.now();
          this.#logger?.warn({ err, subject: batch.subject, buffered: this.buffered }, "could not publish log lines; will retry");
        }
        return false;
      }
      this.#batches.shift();
      this.#batchedLines -= batch.lines.length;
      for (const line of batch.lines) this.#count(appKey(line), -1);
      this.#stats.published += batch.lines.length;
      if (this.#droppedBy.size > 0) this.#tellDropped();
      this.#wakeRoomWaiters();
      if (this.#pending.length > 0) this.#formBatches();
    }
    return true;
  }

  /** Moves pending lines into batches: per subject, at most `batchLines` lines and `maxBatchBytes`. */
  #formBatches(): void {
    if (this.#pending.length === 0) return;
    const bySubject = new Map<string, ValidLogLine[]>();
    for (const line of this.#pending) {
      const subject = this.#bus.subject(subjects.logs(subjectToken(line.app_name), line.source));
      let group = bySubject.get(subject);
      if (!group) bySubject.set(subject, (group = []));
      group.push(line);
    }
    this.#pending = [];
    for (const [subject, lines] of bySubject) {
      let chunk: string[] = [];
      let chunkLines: ValidLogLine[] = [];
      let bytes = 2;
      const close = () => {
        if (chunk.length === 0) return;
        this.#batches.push({ subject, msgId: randomUUID(), lines: chunkLines, body: `[${chunk.join(",")}]` });
        this.#batchedLines += chunkLines.length;
        chunk = [];
        chunkLines = [];
        bytes = 2;
      };
      for (const line of lines) {
        const json = JSON.stringify(line);
        const size = Buffer.byteLength(json) + 1;
        if (chunk.length >= this.#batchLines || (chunk.length > 0 && bytes + size > this.#maxBatchBytes)) close();
        chunk.push(json);
        chunkLines.push(line);
        bytes += size;
      }
      close();
    }
  }
}

/** What names the app a line is of: its group, app and branch. */
export type AppOfLine = Partial<Pick<LogLine, "group_slug" | "app_name" | "branch">>;

/** The app a line counts against (see maxBufferedPerApp); null for a line of no app (the agent's own). */
function appKey(line: AppOfLine): string | null {
  if (!line.app_name) return null;
  return `${line.group_slug ?? ""}\n${line.app_name}\n${line.branch ?? ""}`;
}

/** An app name as one subject token: NATS wildcards, separators and whitespace become `_`. */
export function subjectToken(name: string | null): string {
  if (!name) return "";
  return name.replace(/[.*>\s]/g, "_");
}

function stripUndefined<T extends object>(value: T): Partial<T> {
  const out: Partial<T> = {};
  for (const [k, v] of Object.entries(value)) if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  return out;
}
