/**
 * deploy-queue: the queue (spec doc 1 sections 2.5, 4.5), the authority on work state. Actions are
 * created from `build_requested` events, dispatched on JetStream to agents (work.host.<id> or
 * work.any), claimed through the admission gates, and followed to completion; every change is
 * announced as `action_updated`. GIT_PREFLIGHT rows record apps-builds' preflights (its events),
 * which are never dispatched. Agents are known from their heartbeats. A group renamed in
 * identity re-keys its actions and history; a deleted one drops them.
 */
import { deployQueueEnv, loadConfig, type Config } from "@platform/config";
import { startService, type RunningService } from "@platform/service";
import { entities } from "./entities/index.ts";
import { migrations } from "./migrations/0001_queue.ts";
import { deploymentMigrations } from "./migrations/0002_deployments.ts";
import { groupRenameMigrations } from "./migrations/0003_group_renames.ts";
import { createServiceClient } from "@platform/rpc";
import { consumeEvent, consumeGroupEvents, parseBuildsDeleted, subjects } from "@platform/bus";
import { AppsBuildsService } from "@platform/proto";
import { routes } from "./rpc.ts";
import { startBuildRequestConsumer, startHeartbeatListener, startPeriodicJobs, startPreflightConsumers, startReconcileConsumer } from "./workers.ts";
import { forgetGroup, rekeyGroup } from "./domain/groups.ts";
import { forgetDeletedBranch } from "./domain/branch-deleted.ts";

export type DeployQueueConfig = Config<typeof deployQueueEnv>;

export function build(config: DeployQueueConfig = loadConfig(deployQueueEnv)): Promise<RunningService> {
  return startService({
    name: "deploy-queue",
    config,
    entities,
    migrations: [...migrations, ...deploymentMigrations, ...groupRenameMigrations],
    routes: (ctx) => routes(ctx, createServiceClient(AppsBuildsService, config.APPS_BUILDS_URL, { timeoutMs: 15_000, token: config.PLATFORM_INTERNAL_TOKEN }), { fleetFloor: config.FLEET_FLOOR, orphanedAfterMs: config.ORPHANED_ACTION_AFTER_S * 1000 }),
    async onStart(ctx) {
      const heartbeats = startHeartbeatListener(ctx);
      const intake = await startBuildRequestConsumer(ctx);
      const reconcile = await startReconcileConsumer(ctx);
      const preflights = await startPreflightConsumers(ctx);
      const groups = await consumeGroupEvents({
        bus: ctx.bus,
        orm: ctx.orm,
        logger: ctx.logger,
        service: "deploy-queue",
        renamed: (em, e) => rekeyGroup(em, e.previous_slug, e.slug),
        deleted: (em, e) => forgetGroup(em, e.slugs),
      });
      const branches = await consumeEvent({
        bus: ctx.bus,
        orm: ctx.orm,
        logger: ctx.logger,
        service: "deploy-queue",
        name: "builds-deleted",
        subject: subjects.events.buildsDeleted,
        parse: parseBuildsDeleted,
        handle: forgetDeletedBranch,
      });
      const jobs = startPeriodicJobs(ctx, { orphanedAfterMs: config.ORPHANED_ACTION_AFTER_S * 1000 });
      return [() => jobs.stop(), () => branches.stop(), () => groups.stop(), ...preflights.map((c) => () => c.stop()), () => reconcile.stop(), () => intake.stop(), () => heartbeats.stop()];
    },
  });
}
