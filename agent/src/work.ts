/**
 * The agent's deploy lane (ARCHITECTURE section 4): a durable pull consumer on the host's own
 * subject `work.host.<host_id>` and a shared one on `work.any`. Each message names an action;
 * the agent claims it from deploy-queue (admission gates there), runs it, reports phases and
 * completes it. A redelivered message of an action that is terminal or claimed elsewhere is
 * acknowledged and dropped, so nothing runs twice.
 */
import type { Client } from "@connectrpc/connect";
import { runConsumer, subjects, type Bus, type EventEnvelope, type JsMsg, type RunningConsumer } from "@platform/bus";
import type { Logger } from "@platform/logger";
import type { DeployQueueService } from "@platform/proto";
import { runBuild, type BuildDeps, type BuildJob, type LogLevel } from "./builder.ts";

/** Action types this agent runs; others wait in the queue for an agent that does. */
export const SUPPORTED_ACTIONS = new Set(["BUILD"]);
const UNSUPPORTED_RETRY_MS = 60_000;
const ADMISSION_RETRY_MS = 2_000;
/** JetStream's redelivery window; long builds tell it they are still working. */
const ACK_WAIT_MS = 60_000;

export interface WorkLog {
  (line: { action_id: string; build_id?: string; app_name: string; branch: string; group_slug: string; level: LogLevel; message: string; service_name?: string; source: "build" | "agent" }): void;
}

export interface WorkOptions {
  bus: Bus;
  hostId: string;
  queue: Client<typeof DeployQueueService>;
  logger: Logger;
  log: WorkLog;
  build: Omit<BuildDeps, "log" | "phase" | "hostId">;
}

export interface WorkLane {
  stop(): Promise<void>;
}

export async function startWorkLane(opts: WorkOptions): Promise<WorkLane> {
  const { bus, hostId, queue, logger } = opts;
  const streamName = subjects.streams(bus.prefix).work.name;

  const handle = async (msg: JsMsg) => {
    const envelope = msg.json<EventEnvelope>();
    const { action_id: actionId, action_type: actionType } = envelope.data as { action_id: string; action_type: string };
    if (!SUPPORTED_ACTIONS.has(actionType)) {
      msg.nak(UNSUPPORTED_RETRY_MS);
      return;
    }
    const claim = await queue.claimAction({ actionId, hostId });
    if (claim.drop) return;
    if (!claim.claimed || !claim.action) {
      msg.nak(ADMISSION_RETRY_MS);
      return;
    }
    const action = claim.action;
    const job = JSON.parse(action.payloadJson) as BuildJob;
    job.action_id = actionId;
    const keepAlive = setInterval(() => msg.working(), ACK_WAIT_MS / 3);
    try {
      const outcome = await runBuild(job, {
        ...opts.build,
        hostId,
        log: (line) =>
          opts.log({
            action_id: actionId,
            build_id: job.build_id,
            app_name: job.app_name,
            branch: job.branch,
            group_slug: job.group_slug,
            level: line.level,
            message: line.message,
            service_name: line.service_name,
            source: "build",
          }),
        phase: async (name) => (await queue.reportProgress({ actionId, hostId, phase: name, message: "" })).cancelRequested,
      });
      await queue.completeAction({ actionId, hostId, status: outcome.status, errorMessage: outcome.error_message, resultJson: JSON.stringify(outcome.result) });
      logger.info({ action_id: actionId, status: outcome.status }, "build finished");
    } finally {
      clearInterval(keepAlive);
    }
  };

  const consumers: RunningConsumer[] = [];
  consumers.push(
    await runConsumer({ bus, stream: streamName, durable: `agent-${hostId}`, filterSubject: bus.subject(subjects.work.host(hostId)), logger, handle, ackWaitMs: ACK_WAIT_MS }),
  );
  consumers.push(await runConsumer({ bus, stream: streamName, durable: "agents-any", filterSubject: bus.subject(subjects.work.any), logger, handle, ackWaitMs: ACK_WAIT_MS }));
  return {
    async stop() {
      for (const c of consumers) await c.stop();
    },
  };
}
