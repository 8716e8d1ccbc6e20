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
import type { Action as ActionMsg, DeployQueueService } from "@platform/proto";
import { runBuild, type BuildDeps, type BuildJob, type LogLevel, type PhaseFacts } from "./builder.ts";
import type { Deployer, DeployerDeps, DeployJob } from "./deployer.ts";
import { failureStatus, untilAnswered } from "./until-answered.ts";
import { errorText } from "./error-text.ts";

/** Action types this agent runs; others wait in the queue for an agent that does. */
export const SUPPORTED_ACTIONS = new Set(["BUILD", "DEPLOY", "RETRY", "UNDEPLOY", "SERVICE_ACTION", "RECONCILE_ROUTING"]);
const UNSUPPORTED_RETRY_MS = 60_000;
const ADMISSION_RETRY_MS = 2_000;
/** When a work message for an action this process is already running comes again. */
const BUSY_RETRY_MS = 60_000;
/**
 * Work messages looked at once per consumer. The queue's admission gates decide what runs (per
 * host and per app); every message waiting must be tried for them to choose, so a long build does
 * not keep a prioritized or admit-forced action behind it from being claimed.
 */
const WORK_CONCURRENCY = 8;
/** How many ended actions the lane remembers, to tell a claim refused on account of one just ended. */
const ENDED_KEPT = 1000;
/** How often in a row a claim is asked again at once because its blocker has just moved on. */
const ASK_AGAIN_MAX = 3;
/** How often a running action tells the queue it is alive (stuck_class). */
const ALIVE_REPORT_MS = 20_000;
/** A build reports more often: its answer says a cancel, and the command running is then stopped. */
const BUILD_ALIVE_REPORT_MS = 2_000;
/** How long a phase report is tried again while the queue is out of reach (a restart, say). */
const PHASE_REPORT_PATIENCE_MS = 30_000;

export interface WorkLog {
  (line: {
    action_id: string;
    build_id?: string;
    deployment_id?: string;
    app_name: string;
    branch: string;
    group_slug: string;
    level: LogLevel;
    message: string;
    service_name?: string;
    metadata?: Record<string, unknown>;
    source: "build" | "deploy" | "agent";
  }): void;
}

export interface WorkOptions {
  bus: Bus;
  hostId: string;
  queue: Client<typeof DeployQueueService>;
  logger: Logger;
  log: WorkLog;
  build: Omit<BuildDeps, "log" | "phase" | "hostId">;
  /** Runs the deploy-lane actions beyond BUILD; `phase` and `log` are bound per action. */
  deployer(bind: { log: DeployerDeps["log"]; phase: DeployerDeps["phase"] }): Deployer;
  /** After an action changed what runs here: the fleet should hear of it before the next heartbeat. */
  onFinished?(): void;
  /** Actions this host had in flight when the agent last stopped (from its host state). */
  resumable?(): Array<{ actionId: string; actionType: string }>;
}

export interface WorkLane {
  stop(): Promise<void>;
}

type PhaseFn = (name: string, opts?: { wait?: boolean } & PhaseFacts) => Promise<boolean>;

/**
 * The phase reports of one action, sent in order without holding the work up: a report costs a
 * round trip to the queue, and a deploy or build passes half a dozen phases. `enter` answers
 * whether the queue has said cancel was requested, as far as its answers have come back, so a
 * cancel is honoured at the next phase boundary after the queue saw it; `{ wait: true }` (the
 * swap commit, the point of no return) waits for the answer to its own report. Once the queue
 * said cancel, later phases are not reported.
 */
export function phaseReports(report: (name: string, facts: PhaseFacts) => Promise<boolean>): {
  enter(name: string, opts?: { wait?: boolean } & PhaseFacts): Promise<boolean>;
  settled(): Promise<void>;
} {
  let cancelled = false;
  let chain: Promise<boolean> = Promise.resolve(false);
  return {
    async enter(name, opts) {
      const facts: PhaseFacts = opts?.commit ? { commit: opts.commit } : {};
      const mine = chain.then(async (before) => {
        if (before) return true;
        const now = await report(name, facts);
        if (now) cancelled = true;
        return now;
      });
      // A report that failed (the queue unreachable for a moment) holds up neither the work nor
      // the reports after it; only a waited-for report's failure fails the action.
      chain = mine.catch(() => cancelled);
      return opts?.wait ? mine : cancelled;
    },
    async settled() {
      await chain;
    },
  };
}

export async function startWorkLane(opts: WorkOptions): Promise<WorkLane> {
  const { bus, hostId, queue, logger } = opts;
  const streamName = subjects.streams(bus.prefix).work.name;

  /** Actions this process is claiming or running: a redelivered message of one of them waits. */
  const running = new Set<string>();
  /** The actions this process has claimed and runs, each until it has ended and said so. */
  const executing = new Map<string, Promise<void>>();
  /** The claims this process has asked for and not yet had answered. */
  const claiming = new Map<string, Promise<unknown>>();
  /** The actions this process has lately run to their end, oldest first (at most ENDED_KEPT). */
  const ended = new Set<string>();
  let stopping = false;

  /**
   * Tells the queue how an action ended, until it has heard: the work is done, and a redelivery
   * would run it again. The queue takes a completion twice without harm. Only a refusal (the
   * action is no longer this host's) or the agent stopping ends the attempts.
   */
  const complete = async (actionId: string, req: Parameters<typeof queue.completeAction>[0]) => {
    try {
      await untilAnswered(() => queue.completeAction(req), {
        stopping: () => stopping,
        onRetry: (err, attempt) => logger.warn({ err, action_id: actionId, attempt }, "could not report the action's completion; trying again"),
      });
    } catch (err) {
      if (failureStatus(err) >= 500) throw err;
      logger.warn({ err, action_id: actionId }, "the queue refused the action's completion");
    }
  };

  const handle = async (msg: JsMsg) => {
    const envelope = msg.json<EventEnvelope>();
    const { action_id: actionId, action_type: actionType } = envelope.data as { action_id: string; action_type: string };
    if (!SUPPORTED_ACTIONS.has(actionType)) {
      msg.nak(UNSUPPORTED_RETRY_MS);
      return;
    }
    const outcome = await claimAndRun(actionId, actionType);
    if (outcome === "refused") msg.nak(ADMISSION_RETRY_MS);
    else if (outcome === "busy") msg.nak(BUSY_RETRY_MS);
    else if (outcome === "dropped") await settleDropped(actionId);
  };

  /**
   * The queue ended the action while this host was away (it failed it, or finished it past its
   * swap commit, while the agent was silent): what this host still holds of it is settled all the
   * same, as a resumed deploy would be. Whichever of the agent's start and the action's redelivered
   * message hears "dropped" first does it; the other was told "busy".
   */
  const settleDropped = async (actionId: string) => {
    const deployer = opts.deployer({ log: (line) => logger.info({ action_id: actionId, phase: line.phase }, line.message), phase: async () => false });
    await deployer.abandon(actionId);
  };

  /**
   * Claims the action and runs it; "refused" when admission said not now, "busy" when this
   * process is claiming or running it already. The action counts as running from before its claim:
   * a resumed deploy and its redelivered message, both claimed as a resume, would run it twice.
   */
  const claimAndRun = async (actionId: string, actionType: string): Promise<"done" | "dropped" | "refused" | "busy"> => {
    if (running.has(actionId)) return "busy";
    running.add(actionId);
    try {
      for (let askedAgain = 0; ; ) {
        const asked = queue.claimAction({ actionId, hostId });
        claiming.set(actionId, asked.catch(() => undefined));
        const claim = await asked.finally(() => claiming.delete(actionId));
        if (claim.drop) return "dropped";
        if (claim.claimed && claim.action) {
          const ran = run(actionId, actionType, claim.action, claim.resumed);
          executing.set(actionId, ran.catch(() => undefined));
          try {
            await ran;
          } finally {
            executing.delete(actionId);
            ended.add(actionId);
            if (ended.size > ENDED_KEPT) ended.delete(ended.values().next().value!);
          }
          return "done";
        }
        // Held back by an action this process runs (a deploy by its build, beside it here): tried
        // again the moment that one has ended, not after the redelivery delay. An action that runs
        // waits for nothing, so no two claims wait for each other.
        const blocking = claim.blockingActionId;
        if (stopping || !blocking) return "refused";
        // The two may have come in together, the blocker's claim still unanswered: once it is,
        // the blocker runs here (and is waited for) or not.
        const blockerClaim = claiming.get(blocking);
        if (blockerClaim) await blockerClaim;
        const blocker = executing.get(blocking);
        if (blocker) {
          await blocker;
          continue;
        }
        // Its claim answered, or it ended here, while this claim was on its way: asked once more.
        if ((blockerClaim || ended.has(blocking)) && askedAgain++ < ASK_AGAIN_MAX) continue;
        return "refused";
      }
    } finally {
      running.delete(actionId);
    }
  };

  const run = async (actionId: string, actionType: string, action: ActionMsg, resumed: boolean) => {
    let phaseNow = "";
    const reports = phaseReports(async (name, facts) => {
      const commit = facts.commit ? { hash: facts.commit.hash, message: facts.commit.message, author: facts.commit.author, committedAt: facts.commit.committed_at } : undefined;
      const answer = await untilAnswered(() => queue.reportProgress({ actionId, hostId, phase: name, message: "", commit }), {
        forMs: PHASE_REPORT_PATIENCE_MS,
        stopping: () => stopping,
      });
      return answer.cancelRequested;
    });
    const phase = (name: string, opts?: { wait?: boolean }) => {
      phaseNow = name;
      return reports.enter(name, opts);
    };
    // The queue must see a long action is alive (stuck_class); the bus keeps its message from redelivery.
    // Its answer also says when a build was cancelled meanwhile (or is no longer this host's).
    const cancelled = new AbortController();
    const keepAlive = setInterval(
      () => {
        void queue
          .reportProgress({ actionId, hostId, phase: phaseNow, message: "" })
          .then((answer) => {
            if (answer.cancelRequested) cancelled.abort();
          })
          .catch(() => undefined);
      },
      actionType === "BUILD" ? BUILD_ALIVE_REPORT_MS : ALIVE_REPORT_MS,
    );
    try {
      let outcome: { status: string; error_message: string; result: unknown };
      try {
        outcome = actionType === "BUILD" ? await runBuildAction(action.payloadJson, phase, cancelled.signal) : await runDeployAction(actionType, action.payloadJson, phase);
      } catch (err) {
        // An action that throws has failed. Said so once, it is not run again: a redelivered
        // message would resume it on this host, and a lasting error would loop for ever.
        logger.error({ err, action_id: actionId, action_type: actionType }, "the action failed with an error");
        outcome = { status: "failed", error_message: `The agent on host ${hostId} failed while running the action: ${errorText(err)}`, result: {} };
      }
      // Every phase is recorded before the action ends (the queue takes no phase after that).
      await reports.settled();
      await complete(actionId, { actionId, hostId, status: outcome.status, errorMessage: outcome.error_message, resultJson: JSON.stringify(outcome.result) });
      logger.info({ action_id: actionId, action_type: actionType, status: outcome.status }, "action finished");
      opts.onFinished?.();
    } finally {
      clearInterval(keepAlive);
    }

    /** One line of this action's output, as the log store takes it. */
    function shipLine(
      job: { app_name: string; branch: string; group_slug: string },
      line: { level: LogLevel; message: string; service_name?: string },
      rest: Pick<Parameters<WorkLog>[0], "source" | "build_id" | "deployment_id" | "metadata">,
    ) {
      opts.log({ action_id: actionId, app_name: job.app_name, branch: job.branch, group_slug: job.group_slug, level: line.level, message: line.message, service_name: line.service_name, ...rest });
    }

    async function runBuildAction(payloadJson: string, phase: PhaseFn, signal: AbortSignal) {
      const job = JSON.parse(payloadJson) as BuildJob;
      job.action_id = actionId;
      const log: BuildDeps["log"] = (line) => shipLine(job, line, { source: "build", build_id: job.build_id });
      // A build is not resumed half-way: what the stopped agent had done is thrown away.
      const notice = resumed ? `The agent on host ${hostId} restarted while this build ran; the build starts again from the clone.` : undefined;
      return runBuild(job, { ...opts.build, hostId, log, phase, notice, signal });
    }

    async function runDeployAction(type: string, payloadJson: string, phase: PhaseFn) {
      const job = { ...(JSON.parse(payloadJson) as DeployJob), action_id: actionId, action_type: type };
      const deployer = opts.deployer({
        phase,
        log: (line) =>
          shipLine(job, line, {
            source: "deploy",
            deployment_id: job.deployment_id,
            // The phase a line belongs to; a service's line from `start` on also tells the log
            // store that the service's output stream exists (its log group).
            metadata: { phase: line.phase },
          }),
      });
      switch (type) {
        case "UNDEPLOY":
          return deployer.undeploy(job);
        case "SERVICE_ACTION":
          return deployer.serviceAction(job);
        case "RECONCILE_ROUTING":
          return deployer.reconcile(job);
        default:
          return deployer.deploy(job);
      }
    }
  };

  const consumers: RunningConsumer[] = [];
  consumers.push(
    await runConsumer({ bus, stream: streamName, durable: `agent-${hostId}`, filterSubject: bus.subject(subjects.work.host(hostId)), logger, handle, concurrency: WORK_CONCURRENCY }),
  );
  consumers.push(
    await runConsumer({ bus, stream: streamName, durable: "agents-any", filterSubject: bus.subject(subjects.work.any), logger, handle, concurrency: WORK_CONCURRENCY }),
  );
  // Deploys this host had in flight when the agent stopped are taken up at once: the queue still
  // has them claimed by this host, so the claim resumes them (the deployer finishes or cleans up).
  const resumed = Promise.all(
    (opts.resumable?.() ?? []).map(async ({ actionId, actionType }) => {
      try {
        if ((await claimAndRun(actionId, actionType)) === "dropped") await settleDropped(actionId);
      } catch (err) {
        logger.error({ err, action_id: actionId }, "resuming an action failed");
      }
    }),
  );
  return {
    async stop() {
      stopping = true;
      for (const c of consumers) await c.stop();
      await resumed;
    },
  };
}
