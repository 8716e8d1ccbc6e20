/**
 * Follows `events.deploy_queue.action_updated` so that builds rows (and the app's latest_build)
 * reflect what the queue and the agent did. Idempotent per event.
 */
import { handleOnce, runConsumer, subjects, type EventEnvelope, type RunningConsumer } from "@platform/bus";
import type { ServiceContext } from "@platform/service";
import { applyActionUpdate, type ActionUpdate } from "./domain/builds.ts";

export function startBuildTracker(ctx: ServiceContext): Promise<RunningConsumer> {
  const { bus } = ctx;
  return runConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: "apps-builds-action-updates",
    filterSubject: bus.subject(subjects.events.actionUpdated),
    logger: ctx.logger,
    async handle(msg) {
      await handleOnce(ctx.orm, "apps-builds.action-updates", msg, async (em, event: EventEnvelope) => {
        await applyActionUpdate(em, event.data as unknown as ActionUpdate);
      });
    },
  });
}
