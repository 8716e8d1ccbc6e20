/**
 * Follows `events.deploy_queue.action_updated` so that builds rows (and the app's latest_build)
 * reflect what the queue and the agent did. Idempotent per event; a burst of updates is applied
 * in one transaction.
 */
import { handleBatchOnce, receivedEvents, runBatchConsumer, subjects, type RunningConsumer } from "@platform/bus";
import type { ServiceContext } from "@platform/service";
import { applyActionUpdates, type ActionUpdate } from "./domain/builds.ts";
import { buildRowsWritten } from "./domain/releases.ts";

export function startBuildTracker(ctx: ServiceContext): Promise<RunningConsumer> {
  const { bus } = ctx;
  return runBatchConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: "apps-builds-action-updates",
    filterSubject: bus.subject(subjects.events.actionUpdated),
    logger: ctx.logger,
    async handleBatch(msgs) {
      const events = receivedEvents(msgs).map((r) => r.event);
      const applied = await handleBatchOnce(ctx.orm, "apps-builds.action-updates", events, async (em, todo) => {
        await applyActionUpdates(
          em,
          todo.map((e) => e.data as unknown as ActionUpdate),
        );
      });
      if (applied.length > 0) buildRowsWritten.notify();
    },
  });
}
