/**
 * deploy-queue: the queue (spec doc 1 sections 2.5, 4.5), the authority on work state. Actions are
 * created from `build_requested` events, dispatched on JetStream to agents (work.host.<id> or
 * work.any), claimed through the admission gates, and followed to completion; every change is
 * announced as `action_updated`. Agents are known from their heartbeats.
 */
import { loadConfig, serviceEnv } from "@platform/config";
import { startService, type RunningService, type ServiceConfig } from "@platform/service";
import { entities } from "./entities/index.ts";
import { migrations } from "./migrations/0001_queue.ts";
import { routes } from "./rpc.ts";
import { startBuildRequestConsumer, startHeartbeatListener, startPeriodicJobs } from "./workers.ts";

export function build(config: ServiceConfig = loadConfig(serviceEnv("deploy-queue"))): Promise<RunningService> {
  return startService({
    name: "deploy-queue",
    config,
    entities,
    migrations,
    routes,
    async onStart(ctx) {
      const heartbeats = startHeartbeatListener(ctx);
      const intake = await startBuildRequestConsumer(ctx);
      const jobs = startPeriodicJobs(ctx);
      return [() => jobs.stop(), () => intake.stop(), () => heartbeats.stop()];
    },
  });
}
