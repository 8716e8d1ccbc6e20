/**
 * apps-builds: apps per branch, their preflight state, builds, variables and config layers.
 * Registrations write under identity's group lock; a group renamed there re-keys apps and builds.
 */
import { appsBuildsEnv, loadConfig, type Config } from "@platform/config";
import { startService, type RunningService } from "@platform/service";
import { consumeEvent, consumeGroupEvents, subjects } from "@platform/bus";
import { createServiceClient } from "@platform/rpc";
import { IdentityService } from "@platform/proto";
import { entities } from "./entities/index.ts";
import { variableEntities } from "./entities/variables.ts";
import { startBuildTracker } from "./build-tracker.ts";
import { startPreflightWorker } from "./preflight-worker.ts";
import { buildHandlers } from "./rpc-builds.ts";
import { settingsHandlers } from "./rpc-settings.ts";
import { routes } from "./rpc.ts";
import { variableHandlers } from "./rpc-variables.ts";
import { rekeyGroup } from "./domain/group-rename.ts";
import { parseCrashLoop, recordCrashLoop } from "./domain/crash-loops.ts";
import { appsBuildsMigrations } from "./migrations/index.ts";
import { REGISTRATION_WAIT_MS } from "./domain/group-lock.ts";

export type AppsBuildsConfig = Config<typeof appsBuildsEnv>;

export function build(config: AppsBuildsConfig = loadConfig(appsBuildsEnv)): Promise<RunningService> {
  return startService({
    name: "apps-builds",
    config,
    entities: [...entities, ...variableEntities],
    migrations: appsBuildsMigrations,
    routes: (ctx) =>
      routes(
        // An acquire waits up to REGISTRATION_WAIT_MS for the lease before it answers.
        { ...ctx, config, groupLock: createServiceClient(IdentityService, config.IDENTITY_URL, { timeoutMs: REGISTRATION_WAIT_MS + 5_000, token: config.PLATFORM_INTERNAL_TOKEN }) },
        buildHandlers,
        settingsHandlers,
        variableHandlers,
      ),
    async onStart(ctx) {
      const preflight = await startPreflightWorker(ctx);
      const tracker = await startBuildTracker(ctx);
      const groups = await consumeGroupEvents({
        bus: ctx.bus,
        orm: ctx.orm,
        logger: ctx.logger,
        service: "apps-builds",
        renamed: (em, e) => rekeyGroup(em, [e.previous_slug], e.slug),
      });
      const crashLoops = await consumeEvent({
        bus: ctx.bus,
        orm: ctx.orm,
        logger: ctx.logger,
        service: "apps-builds",
        name: "service-crash-loop",
        subject: subjects.events.serviceCrashLoop,
        parse: parseCrashLoop,
        handle: recordCrashLoop,
      });
      return [() => preflight.stop(), () => tracker.stop(), () => groups.stop(), () => crashLoops.stop()];
    },
  });
}
