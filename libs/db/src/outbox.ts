/**
 * The transactional outbox and the idempotent-consumer ledger, present in every service schema.
 * A domain write and the event announcing it commit in one transaction; the bus relay publishes
 * the row later with `Nats-Msg-Id` = event id and deletes it in the transaction that claimed it,
 * so a crash between commit and publish loses nothing, a publish repeated after a crash is
 * dropped by JetStream's duplicate window, and the table holds only what is still to be sent
 * (the stream keeps what was).
 */
import { randomUUID } from "node:crypto";
import { defineEntity, p } from "@mikro-orm/core";
import { Migration } from "@mikro-orm/migrations";
import type { EntityManager } from "@mikro-orm/postgresql";
import { injectTraceContext } from "@platform/telemetry";

export const OutboxEventSchema = defineEntity({
  name: "OutboxEvent",
  tableName: "outbox",
  properties: {
    id: p.uuid().primary(),
    seq: p.bigint().autoincrement().unique(),
    subject: p.text(),
    payload: p.json<Record<string, unknown>>(),
    headers: p.json<Record<string, string>>(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
export class OutboxEvent extends OutboxEventSchema.class {}
OutboxEventSchema.setClass(OutboxEvent);

export const ProcessedEventSchema = defineEntity({
  name: "ProcessedEvent",
  tableName: "processed_events",
  properties: {
    consumer: p.text().primary(),
    eventId: p.text().primary(),
    processedAt: p.datetime().defaultRaw("now()"),
  },
});
export class ProcessedEvent extends ProcessedEventSchema.class {}
ProcessedEventSchema.setClass(ProcessedEvent);

class OutboxTables extends Migration {
  override up(): void {
    this.addSql(`create table outbox (
      id uuid primary key,
      seq bigserial unique,
      subject text not null,
      payload jsonb not null,
      headers jsonb not null,
      created_at timestamptz not null default now(),
      published_at timestamptz null
    )`);
    this.addSql("create index outbox_unpublished on outbox (seq) where published_at is null");
    this.addSql(`create table processed_events (
      consumer text not null,
      event_id text not null,
      processed_at timestamptz not null default now(),
      primary key (consumer, event_id)
    )`);
  }
}

/**
 * Published rows used to be kept, marked `published_at`: an update that wrote a new row version
 * and index entries per event, in a table nothing ever emptied outside deploy-queue.
 */
class OutboxPublishedRowsDeleted extends Migration {
  override up(): void {
    this.addSql("delete from outbox where published_at is not null");
    this.addSql("drop index if exists outbox_unpublished");
    this.addSql("alter table outbox drop column published_at");
  }
}

export const outboxMigrations = [
  { name: "0000_outbox", class: OutboxTables },
  { name: "0000_outbox_published_rows_deleted", class: OutboxPublishedRowsDeleted },
];

/**
 * Adds an event to the outbox of the transaction `em` belongs to. The current trace context
 * goes with it, so the consumer's work joins the trace of the request that caused it.
 */
export function enqueueEvent(em: EntityManager, subject: string, payload: Record<string, unknown>): string {
  const event = outboxEvent(subject, payload);
  em.create(OutboxEvent, event);
  return event.id;
}

export interface OutboxRow {
  id: string;
  subject: string;
  payload: Record<string, unknown>;
  headers: Record<string, string>;
}

/**
 * The outbox row of an event, for a write that inserts it with SQL of its own (see `sqlPool`):
 * it must go into the same statement or transaction as the rows it announces.
 */
export function outboxEvent(subject: string, payload: Record<string, unknown>): OutboxRow {
  const headers: Record<string, string> = {};
  injectTraceContext({ set: (k, v) => void (headers[k] = v), get: (k) => headers[k] });
  return { id: randomUUID(), subject, payload, headers };
}

/**
 * Records that `consumer` handled `eventId`, inside the transaction doing the handling. False
 * means it was handled before: the caller acknowledges and does nothing.
 */
export async function claimEvent(em: EntityManager, consumer: string, eventId: string): Promise<boolean> {
  return (await claimEvents(em, consumer, [eventId])).has(eventId);
}

/**
 * `claimEvent` for a batch: records every id in one statement and returns those not handled
 * before (an id twice in the batch counts once).
 */
export async function claimEvents(em: EntityManager, consumer: string, eventIds: string[]): Promise<Set<string>> {
  if (eventIds.length === 0) return new Set();
  const rows = await em
    .getConnection()
    .execute<{ event_id: string }[]>(
      "insert into processed_events (consumer, event_id) select ?, unnest(array[?]::text[]) on conflict do nothing returning event_id",
      [consumer, eventIds],
      "all",
      em.getTransactionContext(),
    );
  return new Set(rows.map((r) => r.event_id));
}
