/**
 * MikroORM 7 on Postgres, one schema per service. Migrations are plain classes listed by each
 * service and applied at start under an advisory lock, so replicas starting together never
 * race each other into a half-applied schema.
 */
import pg from "pg";
import { MikroORM, type EntityManager } from "@mikro-orm/postgresql";
import { Migrator, Migration } from "@mikro-orm/migrations";
import type { AnyEntity, EntitySchema, MigrationObject } from "@mikro-orm/core";
import type { Logger } from "@platform/logger";
import { OutboxEvent, ProcessedEvent, outboxMigrations } from "./outbox.ts";

export { MikroORM, Migration, type EntityManager, type MigrationObject };
export { OutboxEvent, ProcessedEvent, enqueueEvent, outboxEvent, claimEvent, claimEvents, type OutboxRow } from "./outbox.ts";
export { Coalescer, type CoalescerOptions, type Settled } from "./coalescing.ts";
export { AuditEntry, AuditEntrySchema, audit } from "./audit.ts";

export interface DatabaseOptions {
  url: string;
  /** The service's own Postgres schema; every table of its entities lives there. */
  schema: string;
  // EntitySchema's generics differ per entity; the list only needs to be handed to MikroORM.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  entities: EntitySchema<any, any>[];
  migrations: MigrationObject[];
  logger?: Logger;
  poolMax?: number;
}

/** Creates the database named in the URL when it does not exist yet (a fresh machine). */
export async function ensureDatabase(url: string): Promise<void> {
  const target = new URL(url);
  const name = decodeURIComponent(target.pathname.slice(1));
  if (!name) return;
  const admin = new URL(url);
  admin.pathname = "/postgres";
  const client = new pg.Client({ connectionString: admin.toString() });
  await client.connect();
  try {
    const found = await client.query("select 1 from pg_database where datname = $1", [name]);
    if (found.rowCount === 0) {
      await client.query(`create database ${pg.escapeIdentifier(name)}`).catch((err: { code?: string }) => {
        // Another process created it between our check and our create.
        if (err.code !== "42P04" && err.code !== "23505") throw err;
      });
    }
  } finally {
    await client.end();
  }
}

export async function openDatabase(opts: DatabaseOptions): Promise<MikroORM> {
  await ensureDatabase(opts.url);
  const orm = await MikroORM.init({
    clientUrl: opts.url,
    // Every pooled connection resolves unqualified names in the service's own schema, so raw SQL
    // (outbox relay, ledgers) never reaches another service's tables by accident.
    driverOptions: { options: `-c search_path=${opts.schema}` },
    schema: opts.schema,
    entities: [...opts.entities, OutboxEvent, ProcessedEvent],
    extensions: [Migrator],
    pool: { min: 0, max: opts.poolMax ?? 10 },
    migrations: {
      schema: opts.schema,
      tableName: "mikro_orm_migrations",
      migrationsList: [...outboxMigrations, ...opts.migrations],
      snapshot: false,
      snapshotOnMigrate: false,
      silent: true,
    },
    allowGlobalContext: false,
    debug: false,
  });
  try {
    await migrateUnderLock(orm, opts);
  } catch (err) {
    await orm.close(true);
    throw err;
  }
  return orm;
}

/** The application_name of the connection holding a schema's migration lock (pg_stat_activity). */
export const MIGRATION_LOCK_APPLICATION = "platform migration lock";

/**
 * Applies pending migrations while holding a session advisory lock keyed by the schema, taken
 * on a connection of its own so the lock outlives each pooled query. That connection ending
 * meanwhile (Postgres restarted, the backend terminated) released the lock, so another process
 * may have migrated beside this one: the start fails, and the next start finds what was applied.
 * Without a listener, pg's 'error' event on an idle client would end the process instead.
 */
async function migrateUnderLock(orm: MikroORM, opts: DatabaseOptions): Promise<void> {
  const lock = new pg.Client({ connectionString: opts.url, application_name: MIGRATION_LOCK_APPLICATION });
  let lost: Error | null = null;
  lock.on("error", (err) => {
    lost ??= err;
  });
  await lock.connect();
  try {
    await lock.query("select pg_advisory_lock(hashtext($1))", [`platform.migrate.${opts.schema}`]);
    await lock.query(`create schema if not exists ${pg.escapeIdentifier(opts.schema)}`);
    const applied = await orm.migrator.up();
    if (applied.length > 0) opts.logger?.info({ schema: opts.schema, migrations: applied.map((m) => m.name) }, "migrations applied");
    await lock.query("select pg_advisory_unlock(hashtext($1))", [`platform.migrate.${opts.schema}`]);
  } catch (err) {
    if (!lost) throw err;
    throw new Error(`The connection holding the migration lock of schema ${opts.schema} was lost during the migrations (${(lost as Error).message}); start again to finish them.`, { cause: err });
  } finally {
    await lock.end().catch(() => undefined);
  }
}

export interface DatabaseFacts {
  database: string;
  tables?: number;
}

/** "ok" or the reason the database cannot be reached; with `deep`, the platform's table count. */
export async function databaseFacts(orm: MikroORM, deep = false): Promise<DatabaseFacts> {
  try {
    const em = orm.em.fork();
    await em.getConnection().execute("select 1");
    if (!deep) return { database: "ok" };
    const [row] = await em
      .getConnection()
      .execute<{ n: string }[]>(
        "select count(*)::text as n from information_schema.tables where table_schema not in ('pg_catalog', 'information_schema') and table_type = 'BASE TABLE'",
      );
    return { database: "ok", tables: Number(row?.n ?? 0) };
  } catch (err) {
    return { database: err instanceof Error ? err.message : String(err) };
  }
}

/**
 * The pg pool under the ORM. Hot paths whose whole write is one or two statements use it
 * directly: the ORM's unit of work costs about a millisecond of CPU per request, more than
 * Postgres spends on the statements. Same pool, same search_path (the service's schema).
 */
export type SqlPool = pg.Pool;

export function sqlPool(orm: MikroORM): Promise<SqlPool> {
  return orm.em.getConnection().getNativeClient();
}

/**
 * Runs `fn` with a client of `pool` held for it: a transaction of several statements, or one
 * that waits on something else between them. pg reports a connection lost while no statement
 * runs as an 'error' event, and a client out of the pool has no listener of the pool's: Postgres
 * restarting while `fn` awaits would be an uncaught error and end the process. Here it fails
 * `fn`'s next statement instead. A client `fn` failed on is discarded, not returned.
 */
export async function withClient<T>(pool: SqlPool, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let failed: Error | undefined;
  const lost = (err: Error) => void (failed = err);
  client.on("error", lost);
  try {
    return await fn(client);
  } catch (err) {
    failed ??= err instanceof Error ? err : new Error(String(err));
    throw err;
  } finally {
    client.removeListener("error", lost);
    client.release(failed);
  }
}

export type { AnyEntity };
