/**
 * apps-builds: apps per branch, their preflight state, builds, variables and config layers.
 */
import { appsBuildsEnv, loadConfig, type Config } from "@platform/config";
import { startService, type RunningService } from "@platform/service";
import { entities } from "./entities/index.ts";
import { migrations } from "./migrations/0001_apps.ts";
import { buildMigrations } from "./migrations/0003_builds.ts";
import { configMigrations } from "./migrations/0004_app_config.ts";
import { startBuildTracker } from "./build-tracker.ts";
import { startPreflightWorker } from "./preflight-worker.ts";
import { buildHandlers } from "./rpc-builds.ts";
import { routes } from "./rpc.ts";

export type AppsBuildsConfig = Config<typeof appsBuildsEnv>;

export function build(config: AppsBuildsConfig = loadConfig(appsBuildsEnv)): Promise<RunningService> {
  return startService({
    name: "apps-builds",
    config,
    entities,
    migrations: [...migrations, ...buildMigrations, ...configMigrations],
    routes: (ctx) => routes({ ...ctx, config }, buildHandlers),
    async onStart(ctx) {
      const preflight = await startPreflightWorker(ctx);
      const tracker = await startBuildTracker(ctx);
      return [() => preflight.stop(), () => tracker.stop()];
    },
  });
}
