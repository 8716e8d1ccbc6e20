/**
 * The life of a service process: connect Postgres (own schema, migrations under lock) and NATS,
 * relay the outbox, serve Connect with readiness, and close everything on SIGTERM. Each service's
 * `app.ts` calls `startService`; tests call the same `build()` without a process of their own.
 */
import type { ConnectRouter } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { serviceEnv, serviceSchema, type Config, type ServiceName } from "@platform/config";
import { createLogger, type Logger } from "@platform/logger";
import { databaseFacts, openDatabase, type EntityManager, type MikroORM, type MigrationObject } from "@platform/db";
import { connectBus, pruneLedger, startOutboxRelay, type Bus, type OutboxRelay } from "@platform/bus";
import { startRpcServer, type RpcServer } from "@platform/rpc";
import { ReadinessRequestSchema, ReadinessResponseSchema, type ReadinessRequest, type ReadinessResponse } from "@platform/proto";
import { shutdownTelemetry } from "@platform/telemetry";
import type { EntitySchema } from "@mikro-orm/core";

export type ServiceConfig = Config<ReturnType<typeof serviceEnv>>;

export interface ServiceContext {
  name: ServiceName;
  config: ServiceConfig;
  logger: Logger;
  orm: MikroORM;
  bus: Bus;
  relay: OutboxRelay;
  schema: string;
  /**
   * Runs `fn` in one transaction (domain rows, audit and outbox events commit together), then
   * wakes the outbox relay.
   */
  write<T>(fn: (em: EntityManager) => Promise<T>): Promise<T>;
  /** A fresh identity map for reads. */
  read<T>(fn: (em: EntityManager) => Promise<T>): Promise<T>;
  /** The Readiness RPC every service answers. */
  readiness(req: ReadinessRequest): Promise<ReadinessResponse>;
}

export interface ServiceDefinition {
  name: ServiceName;
  config: ServiceConfig;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  entities: EntitySchema<any, any>[];
  migrations: MigrationObject[];
  routes: (ctx: ServiceContext) => (router: ConnectRouter) => void;
  /** Work started after the schema is migrated (seeding, consumers); returns its closers. */
  onStart?: (ctx: ServiceContext) => Promise<Array<() => Promise<void>>>;
  logger?: Logger;
}

export interface RunningService {
  ctx: ServiceContext;
  rpc: RpcServer;
  close(): Promise<void>;
}

async function natsStatus(bus: Bus): Promise<string> {
  if (bus.nc.isClosed()) return "connection closed";
  try {
    await bus.nc.flush();
    return "ok";
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
}

const LEDGER_PRUNE_INTERVAL_MS = 3600_000;

/** How soon after start a periodic job first runs, when its interval is longer. */
const FIRST_RUN_MAX_MS = 60_000;

/**
 * Runs `job` every `intervalMs`, never twice at once; `stop` waits for a run in progress. The first
 * run comes within a minute of start: an hourly upkeep of a service restarted more often than hourly
 * (a deploy a day, a crash loop) would otherwise never run.
 */
export function every(intervalMs: number, job: () => Promise<void>): { stop(): Promise<void> } {
  let running: Promise<void> | null = null;
  let stopped = false;
  const run = () => {
    running ??= job().finally(() => {
      running = null;
    });
  };
  let timer: NodeJS.Timeout | undefined;
  const first = setTimeout(() => {
    if (stopped) return;
    run();
    timer = setInterval(run, intervalMs);
    timer.unref();
  }, Math.min(intervalMs, FIRST_RUN_MAX_MS));
  first.unref();
  return {
    async stop() {
      stopped = true;
      clearTimeout(first);
      clearInterval(timer);
      await running;
    },
  };
}

export async function startService(def: ServiceDefinition): Promise<RunningService> {
  const { config } = def;
  const logger = def.logger ?? createLogger({ service: def.name, level: config.LOG_LEVEL });
  const schema = serviceSchema(def.name);
  const orm = await openDatabase({ url: config.DATABASE_URL, schema, entities: def.entities, migrations: def.migrations, logger });
  const bus = await connectBus({ url: config.NATS_URL, name: def.name, prefix: config.BUS_PREFIX ?? "", logger });
  const relay = startOutboxRelay({ orm, bus, logger });
  const ledgerUpkeep = every(LEDGER_PRUNE_INTERVAL_MS, () =>
    pruneLedger(orm).then(
      (n) => void (n > 0 && logger.info({ entries: n }, "consumer ledger pruned")),
      (err: unknown) => logger.warn({ err }, "consumer ledger prune failed"),
    ),
  );

  const readiness = async (req: ReadinessRequest): Promise<ReadinessResponse> => {
    const [db, nats] = await Promise.all([databaseFacts(orm, req.deep), natsStatus(bus)]);
    return create(ReadinessResponseSchema, {
      service: def.name,
      ready: db.database === "ok" && nats === "ok",
      database: db.database,
      nats,
      tables: db.tables ?? 0,
    });
  };
  const write = async <T>(fn: (em: EntityManager) => Promise<T>): Promise<T> => {
    const result = await orm.em.fork().transactional(fn);
    relay.kick();
    return result;
  };
  const read = <T>(fn: (em: EntityManager) => Promise<T>): Promise<T> => fn(orm.em.fork());
  const ctx: ServiceContext = { name: def.name, config, logger, orm, bus, relay, schema, write, read, readiness };
  const closers = (await def.onStart?.(ctx)) ?? [];
  if (!config.PLATFORM_INTERNAL_TOKEN) logger.warn("PLATFORM_INTERNAL_TOKEN is not set: the RPC port answers any caller that reaches it");
  const rpc = await startRpcServer({
    port: config.RPC_PORT,
    host: config.RPC_HOST,
    token: config.PLATFORM_INTERNAL_TOKEN,
    routes: def.routes(ctx),
    logger,
    readiness: async () => {
      const r = await readiness(create(ReadinessRequestSchema, {}));
      return { ready: r.ready, service: r.service, database: r.database, nats: r.nats };
    },
  });
  logger.info({ port: rpc.port }, `${def.name} ready`);

  let closing: Promise<void> | null = null;
  return {
    ctx,
    rpc,
    close() {
      closing ??= (async () => {
        await rpc.close();
        await ledgerUpkeep.stop();
        for (const c of closers) await c().catch((err: unknown) => logger.warn({ err }, "closer failed"));
        await relay.stop();
        await bus.close();
        await orm.close(true);
      })();
      return closing;
    },
  };
}

/**
 * Process entry: start, then close cleanly on SIGTERM or SIGINT (exit 0), or exit 1 if the start
 * itself fails.
 */
export function runMain(name: string, start: () => Promise<{ close(): Promise<void> }>): void {
  const logger = createLogger({ service: name, level: process.env.LOG_LEVEL || "info" });
  start().then(
    (running) => {
      const stop = (signal: string) => {
        logger.info({ signal }, "shutting down");
        const force = setTimeout(() => process.exit(1), 10_000);
        force.unref();
        running
          .close()
          .then(shutdownTelemetry)
          .then(
            () => process.exit(0),
            (err: unknown) => {
              logger.error({ err }, "shutdown failed");
              process.exit(1);
            },
          );
      };
      process.once("SIGTERM", () => stop("SIGTERM"));
      process.once("SIGINT", () => stop("SIGINT"));
    },
    (err: unknown) => {
      logger.fatal({ err }, `${name} failed to start`);
      void shutdownTelemetry().finally(() => process.exit(1));
    },
  );
}
