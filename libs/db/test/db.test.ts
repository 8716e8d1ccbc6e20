import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { defineEntity, p } from "@mikro-orm/core";
import type { Logger } from "@platform/logger";
import { TEST_DATABASE_PREFIX, createTestDatabase, dropDatabase, testServerUrl, uniquePrefix } from "@platform/testing";
import { MIGRATION_LOCK_APPLICATION, Migration, OutboxEvent, claimEvent, databaseFacts, enqueueEvent, openDatabase, withClient, type MikroORM } from "../src/index.ts";

const WidgetSchema = defineEntity({
  name: "Widget",
  tableName: "widget",
  properties: {
    id: p.integer().primary().autoincrement(),
    name: p.text(),
  },
});
class Widget extends WidgetSchema.class {}
WidgetSchema.setClass(Widget);

class WidgetTable extends Migration {
  override up(): void {
    // Deliberately not idempotent: a second run of this migration would fail.
    this.addSql("create table widget (id serial primary key, name text not null)");
  }
}
const migrations = [{ name: "0001_widget", class: WidgetTable }];

/** A logger that only records what `openDatabase` reports. */
function recordingLogger() {
  const applied: string[][] = [];
  const logger = {
    info: (obj: { migrations?: string[] }, _msg?: string) => {
      if (obj?.migrations) applied.push(obj.migrations);
    },
    warn: () => undefined,
    error: () => undefined,
    debug: () => undefined,
  } as unknown as Logger;
  return { logger, applied };
}

let client: pg.Client;
const created: string[] = [];
const orms: MikroORM[] = [];

async function open(url: string, schema: string, logger?: Logger): Promise<MikroORM> {
  const orm = await openDatabase({ url, schema, entities: [WidgetSchema], migrations, logger, poolMax: 3 });
  orms.push(orm);
  return orm;
}

async function migrationRows(db: pg.Client, schema: string): Promise<string[]> {
  const r = await db.query<{ name: string }>(`select name from ${pg.escapeIdentifier(schema)}.mikro_orm_migrations order by id`);
  return r.rows.map((row) => row.name);
}

async function tablesOf(db: pg.Client, schema: string): Promise<string[]> {
  const r = await db.query<{ table_name: string }>(
    "select table_name from information_schema.tables where table_schema = $1 and table_type = 'BASE TABLE' order by table_name",
    [schema],
  );
  return r.rows.map((row) => row.table_name);
}

function urlOf(name: string): string {
  const url = new URL(testServerUrl());
  url.pathname = `/${name}`;
  return url.toString();
}

// The database of this file does not exist yet: openDatabase must create it.
const url = urlOf(`${TEST_DATABASE_PREFIX}${uniquePrefix("db")}`);
created.push(url);

beforeAll(() => {
  client = new pg.Client({ connectionString: url });
});

afterAll(async () => {
  for (const orm of orms) await orm.close(true).catch(() => undefined);
  await client?.end().catch(() => undefined);
  for (const u of created) await dropDatabase(u).catch(() => undefined);
});

describe("openDatabase", () => {
  let orm: MikroORM;

  it("creates a missing database, the schema and the tables, and records the migrations", async () => {
    const { logger, applied } = recordingLogger();
    orm = await open(url, "svc_one", logger);
    await client.connect();
    expect(await tablesOf(client, "svc_one")).toEqual(["mikro_orm_migrations", "outbox", "processed_events", "widget"]);
    expect(await migrationRows(client, "svc_one")).toEqual(["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]);
    expect(applied).toEqual([["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]]);
    // Nothing lands in public.
    expect(await tablesOf(client, "public")).toEqual([]);
  });

  it("maps the listed entity onto the service's schema", async () => {
    const em = orm.em.fork();
    em.create(Widget, { name: "sprocket" });
    await em.flush();
    const rows = await client.query("select name from svc_one.widget");
    expect(rows.rows).toEqual([{ name: "sprocket" }]);
    const found = await orm.em.fork().findOneOrFail(Widget, { name: "sprocket" });
    expect(found.id).toBeGreaterThan(0);
    // Raw SQL on a pooled connection resolves unqualified names in the service schema.
    const [row] = await orm.em.fork().getConnection().execute<{ s: string }[]>("select current_schema() as s");
    expect(row?.s).toBe("svc_one");
  });

  it("applies nothing on a second open", async () => {
    const { logger, applied } = recordingLogger();
    await open(url, "svc_one", logger);
    expect(applied).toEqual([]);
    expect(await migrationRows(client, "svc_one")).toEqual(["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]);
  });

  it("reports the database and its table count", async () => {
    expect(await databaseFacts(orm)).toEqual({ database: "ok" });
    expect(await databaseFacts(orm, true)).toEqual({ database: "ok", tables: 4 });
  });

  it("applies migrations exactly once when two processes open the same schema together", async () => {
    const a = recordingLogger();
    const b = recordingLogger();
    const [one, two] = await Promise.all([open(url, "svc_race", a.logger), open(url, "svc_race", b.logger)]);
    expect(await migrationRows(client, "svc_race")).toEqual(["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]);
    expect([...a.applied, ...b.applied]).toEqual([["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]]);
    expect((await databaseFacts(one)).database).toBe("ok");
    expect((await databaseFacts(two)).database).toBe("ok");
    expect((await databaseFacts(one, true)).tables).toBe(8);
  });

  it("creates a missing database once when several processes start together", async () => {
    const fresh = urlOf(`${TEST_DATABASE_PREFIX}${uniquePrefix("db")}`);
    created.push(fresh);
    const loggers = [recordingLogger(), recordingLogger(), recordingLogger()];
    const opened = await Promise.all(loggers.map((l) => open(fresh, "svc_fresh", l.logger)));
    expect(opened).toHaveLength(3);
    expect(loggers.flatMap((l) => l.applied)).toEqual([["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]]);
  });

  it("reports the reason when the database cannot be reached", async () => {
    const scratch = await createTestDatabase();
    created.push(scratch);
    const lost = await open(scratch, "svc_lost");
    expect((await databaseFacts(lost)).database).toBe("ok");
    // The database goes away under the running service.
    await dropDatabase(scratch);
    const facts = await databaseFacts(lost, true);
    expect(facts.database).not.toBe("ok");
    expect(facts.database.length).toBeGreaterThan(0);
    expect(facts.database).toMatch(/terminat|does not exist|connection/i);
    expect(facts.tables).toBeUndefined();
  });

  it("fails the start, without ending the process, when the migration lock's connection is lost", async () => {
    class LockLost extends Migration {
      override up(): void {
        this.addSql(`select pg_terminate_backend(pid) from pg_stat_activity where application_name = '${MIGRATION_LOCK_APPLICATION}' and datname = current_database()`);
        // The lock's client hears of its end while the migrations still run.
        this.addSql("select pg_sleep(0.3)");
        this.addSql("create table after_lock_lost (id int)");
      }
    }
    await expect(
      openDatabase({ url, schema: "svc_lock_lost", entities: [], migrations: [{ name: "0001_lock_lost", class: LockLost }] }),
    ).rejects.toThrow(/connection holding the migration lock of schema svc_lock_lost was lost/);
    // What the migration did was committed; the next start finds it applied and goes on.
    const again = await openDatabase({ url, schema: "svc_lock_lost", entities: [], migrations: [{ name: "0001_lock_lost", class: LockLost }] });
    orms.push(again);
    expect(await migrationRows(client, "svc_lock_lost")).toEqual(["0000_outbox", "0000_outbox_published_rows_deleted", "0001_lock_lost"]);
  });

  it("fails, and closes what it opened, when a migration fails", async () => {
    class Broken extends Migration {
      override up(): void {
        this.addSql("create table nope (");
      }
    }
    await expect(
      openDatabase({ url, schema: "svc_broken", entities: [], migrations: [{ name: "0001_broken", class: Broken }] }),
    ).rejects.toThrow();
    // The lock was released: the schema can be opened with a correct list.
    const fixed = await open(url, "svc_broken");
    expect(await migrationRows(client, "svc_broken")).toEqual(["0000_outbox", "0000_outbox_published_rows_deleted", "0001_widget"]);
    expect((await databaseFacts(fixed)).database).toBe("ok");
  });
});

describe("outbox and ledger", () => {
  let orm: MikroORM;
  beforeAll(async () => {
    orm = await open(url, "svc_events");
  });

  it("enqueueEvent commits the event with the transaction", async () => {
    const id = await orm.em.fork().transactional(async (em) => enqueueEvent(em, "events.test.created", { name: "a", n: 1 }));
    expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const rows = await client.query("select subject, payload, headers from svc_events.outbox where id = $1", [id]);
    expect(rows.rows).toEqual([{ subject: "events.test.created", payload: { name: "a", n: 1 }, headers: {} }]);
    const event = await orm.em.fork().findOneOrFail(OutboxEvent, { id });
    expect(event.subject).toBe("events.test.created");
  });

  it("enqueueEvent leaves nothing when the transaction rolls back", async () => {
    let id = "";
    await expect(
      orm.em.fork().transactional(async (em) => {
        id = enqueueEvent(em, "events.test.rolled_back", {});
        await em.flush();
        throw new Error("abort");
      }),
    ).rejects.toThrow("abort");
    expect(id).not.toBe("");
    const rows = await client.query("select 1 from svc_events.outbox where id = $1 or subject = 'events.test.rolled_back'", [id]);
    expect(rows.rowCount).toBe(0);
  });

  it("keeps events in commit order", async () => {
    const ids = await orm.em.fork().transactional(async (em) => [
      enqueueEvent(em, "events.test.order", { i: 1 }),
      enqueueEvent(em, "events.test.order", { i: 2 }),
      enqueueEvent(em, "events.test.order", { i: 3 }),
    ]);
    const rows = await client.query("select id from svc_events.outbox where subject = 'events.test.order' order by seq");
    expect(rows.rows.map((r) => r.id)).toEqual(ids);
  });

  it("claimEvent is true once per consumer and event, false after", async () => {
    const claim = (consumer: string, eventId: string) => orm.em.fork().transactional((em) => claimEvent(em, consumer, eventId));
    expect(await claim("mailer", "e-1")).toBe(true);
    expect(await claim("mailer", "e-1")).toBe(false);
    expect(await claim("mailer", "e-1")).toBe(false);
    expect(await claim("billing", "e-1")).toBe(true);
    expect(await claim("mailer", "e-2")).toBe(true);
    const rows = await client.query("select consumer, event_id from svc_events.processed_events order by consumer, event_id");
    expect(rows.rows).toEqual([
      { consumer: "billing", event_id: "e-1" },
      { consumer: "mailer", event_id: "e-1" },
      { consumer: "mailer", event_id: "e-2" },
    ]);
  });

  it("a claim made in a transaction that rolls back does not count", async () => {
    await expect(
      orm.em.fork().transactional(async (em) => {
        expect(await claimEvent(em, "mailer", "e-3")).toBe(true);
        // Within the same transaction the claim is already visible.
        expect(await claimEvent(em, "mailer", "e-3")).toBe(false);
        throw new Error("handler failed");
      }),
    ).rejects.toThrow("handler failed");
    expect(await orm.em.fork().transactional((em) => claimEvent(em, "mailer", "e-3"))).toBe(true);
  });

  it("concurrent claims of one event let exactly one through", async () => {
    const results = await Promise.all(
      Array.from({ length: 3 }, () => orm.em.fork().transactional((em) => claimEvent(em, "racer", "e-race"))),
    );
    expect(results.filter(Boolean)).toHaveLength(1);
  });
});

describe("withClient", () => {
  it("fails the work whose connection Postgres ended while it waited, not the process, and the pool goes on", async () => {
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    const killer = new pg.Client({ connectionString: url });
    await killer.connect();
    try {
      let resume: () => void = () => undefined;
      const waiting = new Promise<void>((resolve) => (resume = resolve));
      const work = withClient(pool, async (held) => {
        await held.query("begin");
        const { rows } = await held.query<{ pid: number }>("select pg_backend_pid() as pid");
        await killer.query("select pg_terminate_backend($1)", [rows[0]!.pid]);
        // Idle in its transaction, as a relay waiting for its publishes, when the connection ends.
        await waiting;
        return held.query("commit");
      });
      await new Promise((r) => setTimeout(r, 200));
      resume();
      await expect(work).rejects.toThrow(/terminat|not queryable/i);
      expect(await withClient(pool, async (held) => (await held.query<{ n: number }>("select 1 as n")).rows)).toEqual([{ n: 1 }]);
    } finally {
      await killer.end();
      await pool.end();
    }
  });
});
