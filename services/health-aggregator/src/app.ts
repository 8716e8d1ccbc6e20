/**
 * health-aggregator: the log store (ingested from the LOGS stream, served to GET /api/logs), and,
 * as their issues land, incidents, uptime checks, OOM events, warnings and the health summary.
 */
import { healthAggregatorEnv, loadConfig, type Config } from "@platform/config";
import { every, startService, type RunningService } from "@platform/service";
import { consumeEvent, consumeGroupEvents, parseBuildsDeleted, subjects } from "@platform/bus";
import { entities } from "./entities/index.ts";
import { migrations } from "./migrations/0001_logs.ts";
import { logBuildsMigrations } from "./migrations/0002_log_builds.ts";
import { logGroupsMigrations } from "./migrations/0003_log_groups.ts";
import { logBranchesDroppedMigrations } from "./migrations/0004_log_branches_dropped.ts";
import { searchWordsMigrations } from "./migrations/0005_search_words.ts";
import { logTombstonesMigrations } from "./migrations/0006_log_tombstones.ts";
import { LogStore } from "./domain/log-store.ts";
import { forgetGroup, rekeyGroup } from "./domain/groups.ts";
import { forgetBuilds } from "./domain/builds-deleted.ts";
import { LOG_PRUNE_INTERVAL_MS, logRetentionCutoff } from "./domain/retention.ts";
import { startLogIngestion, type LogIngestion, type LogIngestionOptions } from "./log-ingestion.ts";
import { routes } from "./rpc.ts";

export interface HealthAggregatorOptions {
  ingestion?: LogIngestionOptions;
}

export interface HealthAggregator extends RunningService {
  store: LogStore;
  ingestion: LogIngestion;
}

export async function build(
  config: Config<typeof healthAggregatorEnv> = loadConfig(healthAggregatorEnv),
  options: HealthAggregatorOptions = {},
): Promise<HealthAggregator> {
  let store: LogStore | undefined;
  let ingestion: LogIngestion | undefined;
  const running = await startService({
    name: "health-aggregator",
    config,
    entities,
    migrations: [...migrations, ...logBuildsMigrations, ...logGroupsMigrations, ...logBranchesDroppedMigrations, ...searchWordsMigrations, ...logTombstonesMigrations],
    // Called after onStart, which has opened the store.
    routes: (ctx) => routes(ctx, store!),
    async onStart(ctx) {
      const logStore = new LogStore({ url: config.DATABASE_URL, schema: ctx.schema, logger: ctx.logger });
      store = logStore;
      ingestion = await startLogIngestion(ctx, logStore, options.ingestion).catch(async (err: unknown) => {
        await logStore.close();
        throw err;
      });
      const started = ingestion;
      const groups = await consumeGroupEvents({
        bus: ctx.bus,
        orm: ctx.orm,
        logger: ctx.logger,
        service: "health-aggregator",
        renamed: (em, e) => rekeyGroup(em, e.previous_slug, e.slug),
        deleted: (em, e) => forgetGroup(em, e.slugs, e.deleted_at ?? new Date()),
      });
      const builds = await consumeEvent({
        bus: ctx.bus,
        orm: ctx.orm,
        logger: ctx.logger,
        service: "health-aggregator",
        name: "builds-deleted",
        subject: subjects.events.buildsDeleted,
        parse: parseBuildsDeleted,
        handle: forgetBuilds,
      });
      const retention = every(LOG_PRUNE_INTERVAL_MS, async () => {
        try {
          const deleted = await logStore.prune(logRetentionCutoff(new Date(), config.LOG_RETENTION_DAYS));
          if (deleted > 0) ctx.logger.info({ deleted, retention_days: config.LOG_RETENTION_DAYS }, "log lines past their retention deleted");
        } catch (err) {
          ctx.logger.warn({ err }, "log retention failed");
        }
      });
      return [() => retention.stop(), () => builds.stop(), () => groups.stop(), () => started.stop(), () => logStore.close()];
    },
  });
  return Object.assign(running, { store: store!, ingestion: ingestion! });
}
