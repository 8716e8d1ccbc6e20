/**
 * apps-builds: apps per branch, their preflight state, and (with later issues) config layers,
 * builds and variables.
 */
import { appsBuildsEnv, loadConfig, type Config } from "@platform/config";
import { startService, type RunningService } from "@platform/service";
import { entities } from "./entities/index.ts";
import { migrations } from "./migrations/0001_apps.ts";
import { startPreflightWorker } from "./preflight-worker.ts";
import { routes } from "./rpc.ts";

export type AppsBuildsConfig = Config<typeof appsBuildsEnv>;

export function build(config: AppsBuildsConfig = loadConfig(appsBuildsEnv)): Promise<RunningService> {
  return startService({
    name: "apps-builds",
    config,
    entities,
    migrations,
    routes: (ctx) => routes({ ...ctx, config }),
    async onStart(ctx) {
      const worker = await startPreflightWorker(ctx);
      return [() => worker.stop()];
    },
  });
}
