/**
 * Log ingestion: a durable pull consumer on the LOGS stream (`logs.>`) that stores lines in
 * batches. Messages are gathered until 256 messages or 1 MiB wait, or 100 ms after the first;
 * each batch is one INSERT (all its lines), and its messages are acknowledged after the commit.
 *
 * - A message that is not a batch of lines at all is terminated (never redelivered); invalid
 *   lines inside a batch are logged and skipped, the rest stored.
 * - A batch the database refuses for its data (SQLSTATE 22/23) is stored again message by
 *   message, then line by line, so one bad line cannot jam the consumer: bad lines are dropped.
 * - Any other failure (Postgres down, timeouts) naks the batch with a growing delay: the lines
 *   wait in the stream (kept 24 h) until the store is back.
 * - Redelivery is harmless: every line has an id and a stored id is skipped (`ingest.ts`).
 *
 * Replicas share the durable consumer, so they split the stream between them.
 */
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream";
import { HeldMessages, ensureDurable, subjects, type JsMsg } from "@platform/bus";
import type { ServiceContext } from "@platform/service";
import { linesOfMessage, type MessageLines, type StoredLine } from "./domain/ingest.ts";
import { isDataError, type LogStore } from "./domain/log-store.ts";

export const LOG_CONSUMER = "health-aggregator-logs";

export interface LogIngestionOptions {
  /** Store a batch once this many messages wait (default 256). */
  maxBatchMessages?: number;
  /** ... or this many payload bytes (default 1 MiB). */
  maxBatchBytes?: number;
  /** ... or this long after the first message arrived (default 100 ms). */
  maxDelayMs?: number;
  /**
   * How long JetStream waits for a sign of life before redelivering (default ACK_WAIT_MS). Held
   * messages are marked in progress while they wait for their batch, so only what a stopped
   * aggregator held is redelivered, that long after it stopped (30 s once: lines were late).
   */
  ackWaitMs?: number;
  /**
   * Runs after a batch committed and before its messages are acknowledged (metrics, tests).
   * If it throws, the batch is nak'd and delivered again: its lines are not stored twice.
   */
  afterCommit?: (batch: { messages: number; lines: number; stored: number }) => void | Promise<void>;
}

export interface LogIngestionStats {
  batches: number;
  messages: number;
  /** Lines newly stored. */
  stored: number;
  /** Lines skipped because their id was already stored (redelivery, a publish repeated). */
  duplicates: number;
  /** Lines of a build, branch or group deleted before they arrived, dropped (domain/forgetting.ts). */
  forgotten: number;
  /** Lines refused by validation or by the database, dropped. */
  rejectedLines: number;
  /** Messages terminated because they hold no batch of lines. */
  terminated: number;
  /** Batches nak'd for a later try. */
  failures: number;
}

export interface LogIngestion {
  stats(): LogIngestionStats;
  stop(): Promise<void>;
}

interface Decoded {
  msg: JsMsg;
  lines: StoredLine[];
}

function retryDelayMs(msg: JsMsg): number {
  return Math.min(30_000, 1000 * 2 ** Math.min(5, Math.max(0, msg.info.deliveryCount - 1)));
}

export async function startLogIngestion(ctx: ServiceContext, store: LogStore, opts: LogIngestionOptions = {}): Promise<LogIngestion> {
  const { bus, logger } = ctx;
  const stream = subjects.streams(bus.prefix).logs.name;
  const maxMessages = opts.maxBatchMessages ?? 256;
  const maxBytes = opts.maxBatchBytes ?? 1024 * 1024;
  const maxDelayMs = opts.maxDelayMs ?? 100;
  const stats: LogIngestionStats = { batches: 0, messages: 0, stored: 0, duplicates: 0, forgotten: 0, rejectedLines: 0, terminated: 0, failures: 0 };
  const held = new HeldMessages(opts.ackWaitMs);

  await ensureDurable(bus.jsm, stream, {
    durable_name: LOG_CONSUMER,
    filter_subject: bus.subject(subjects.allLogs),
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    ack_wait: held.ackWaitMs * 1_000_000,
    max_deliver: -1,
    // Bounds what one replica holds in memory while the store is slow.
    max_ack_pending: maxMessages * 8,
  });

  const decode = (msg: JsMsg): Decoded | null => {
    let decoded: MessageLines;
    try {
      decoded = linesOfMessage(msg.data, msg.info.stream, msg.seq);
    } catch (err) {
      stats.terminated++;
      logger.warn({ subject: msg.subject, seq: msg.seq, reason: (err as Error).message }, "log message dropped: not a batch of log lines");
      // No reason text: the machine's nats-server (2.9) ignores a "+TERM <reason>" it cannot parse.
      msg.term();
      return null;
    }
    if (decoded.rejected.length > 0) {
      stats.rejectedLines += decoded.rejected.length;
      logger.warn({ subject: msg.subject, seq: msg.seq, rejected: decoded.rejected.slice(0, 5), count: decoded.rejected.length }, "invalid log lines dropped");
    }
    return { msg, lines: decoded.lines };
  };

  const nak = (items: Decoded[], err: unknown) => {
    stats.failures++;
    logger.warn({ err, messages: items.length }, "could not store log lines; they will be delivered again");
    for (const { msg } of items) msg.nak(retryDelayMs(msg));
  };

  const storeLines = async (lines: StoredLine[]): Promise<void> => {
    const { stored, forgotten } = await store.insert(lines);
    stats.stored += stored;
    stats.forgotten += forgotten;
    stats.duplicates += lines.length - stored - forgotten;
  };

  /** After a data error: message by message, and line by line within a refused message. */
  const storeOneByOne = async (items: Decoded[]): Promise<void> => {
    for (const item of items) {
      try {
        await storeLines(item.lines);
      } catch (err) {
        if (!isDataError(err)) return nak([item], err);
        for (const line of item.lines) {
          try {
            await storeLines([line]);
          } catch (lineErr) {
            if (!isDataError(lineErr)) return nak([item], lineErr);
            stats.rejectedLines++;
            logger.warn({ err: lineErr, subject: item.msg.subject, line_id: line.line_id }, "log line refused by the store; dropped");
          }
        }
      }
      item.msg.ack();
    }
  };

  const storeBatch = async (batch: JsMsg[]): Promise<void> => {
    stats.batches++;
    stats.messages += batch.length;
    const items = batch.map(decode).filter((d): d is Decoded => d !== null);
    const lines = items.flatMap((d) => d.lines);
    try {
      const before = stats.stored;
      await storeLines(lines);
      await opts.afterCommit?.({ messages: items.length, lines: lines.length, stored: stats.stored - before });
    } catch (err) {
      if (isDataError(err)) return storeOneByOne(items);
      return nak(items, err);
    }
    for (const { msg } of items) msg.ack();
  };

  // The batcher: messages wait in `pending` until a batch is cut; batches are stored one after
  // another (`chain`), and the consume loop waits when too many are queued.
  let pending: JsMsg[] = [];
  let pendingBytes = 0;
  let queued = 0;
  let timer: NodeJS.Timeout | null = null;
  let chain: Promise<void> = Promise.resolve();
  const cut = () => {
    if (timer) clearTimeout(timer);
    timer = null;
    if (pending.length === 0) return;
    const batch = pending;
    pending = [];
    pendingBytes = 0;
    chain = chain.then(async () => {
      try {
        await storeBatch(batch);
      } catch (err) {
        // storeBatch handles its failures; anything here is a bug, and redelivery recovers it.
        logger.error({ err }, "log batch failed");
      } finally {
        held.settled(batch);
        queued -= batch.length;
      }
    });
  };
  const add = (msg: JsMsg) => {
    held.taken(msg);
    pending.push(msg);
    pendingBytes += msg.data.length;
    queued++;
    if (pending.length >= maxMessages || pendingBytes >= maxBytes) cut();
    else timer ??= setTimeout(cut, maxDelayMs);
  };

  let stopped = false;
  let current: { close(): Promise<void | Error> } | null = null;
  const loop = (async () => {
    while (!stopped) {
      try {
        const consumer = await bus.js.consumers.get(stream, LOG_CONSUMER);
        const messages = await consumer.consume({ max_messages: maxMessages });
        current = messages;
        // stop() may have run while this consume was being set up: it could not close it then.
        // (Not awaited: close() settles only once the iterator below has ended.)
        if (stopped) void messages.close();
        for await (const msg of messages) {
          add(msg);
          if (queued >= maxMessages * 4) await chain;
          if (stopped) break;
        }
      } catch (err) {
        if (!stopped) {
          logger.warn({ err }, "log consumer failed; re-establishing");
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    }
  })();

  return {
    stats: () => ({ ...stats }),
    async stop() {
      stopped = true;
      await current?.close();
      await loop;
      cut();
      await chain;
      held.close();
    },
  };
}
