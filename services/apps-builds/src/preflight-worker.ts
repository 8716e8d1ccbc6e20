/**
 * Carries out queued preflights: asks any agent (fast RPC GIT_PREFLIGHT over NATS request/reply,
 * never the deploy lane) and records its answer. The request is a committed outbox event, so a
 * crash before the answer only means the event is delivered again.
 */
import { handleOnce, requestOfAgent, runConsumer, subjects, type EventEnvelope, type RunningConsumer } from "@platform/bus";
import type { ServiceContext } from "@platform/service";
import { App } from "./entities/index.ts";
import { announcePreflightChecked, applyPreflightAnswer, preflightOutcome, type PreflightAnswer, type PreflightRequest } from "./domain/preflight.ts";

/** Longer than the agent's own git timeouts, so the agent answers first. */
const AGENT_TIMEOUT_MS = 90_000;
/**
 * Preflights asked of agents at once. A request that reached an agent which then died waits
 * until the agent's silence shows (about 17 s, see agent-rpc.ts in @platform/bus); one at a
 * time, every other app's preflight (and so its builds) would wait too. Two preflights of one
 * app may overlap: the nonce keeps only the newer one's answer.
 */
const CONCURRENT_PREFLIGHTS = 16;

export async function startPreflightWorker(ctx: ServiceContext): Promise<RunningConsumer> {
  const { bus } = ctx;
  // A stop does not wait out a request no agent will answer: it is asked again after a restart.
  const stopping = new AbortController();
  const consumer = await runConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: "apps-builds-preflight",
    filterSubject: bus.subject(subjects.events.preflightRequested),
    logger: ctx.logger,
    concurrency: CONCURRENT_PREFLIGHTS,
    async handle(msg) {
      const event = msg.json<EventEnvelope>();
      const request = event.data as unknown as PreflightRequest;
      const current = await ctx.read((em) => em.findOne(App, { id: request.app_id }));
      if (!current || current.preflightNonce !== request.nonce) {
        await handleOnce(ctx.orm, "apps-builds.preflight", msg, async (em) => {
          const message = current ? "A newer preflight of the app replaced it before an agent was asked." : "The app was deleted before an agent was asked.";
          announcePreflightChecked(em, request, { status: "cancelled", preflight_status: null, message });
        });
        return;
      }
      // No agent listening fails at once ("no responders"), an agent that died holding the
      // request once its silence shows; either way the message is redelivered later.
      const reply = await requestOfAgent(bus.nc, bus.subject(subjects.agentRpcAny("git_preflight")), JSON.stringify(request), {
        timeoutMs: AGENT_TIMEOUT_MS,
        signal: stopping.signal,
      });
      const answer = reply.json<PreflightAnswer>();
      // The agent itself failed (no git, no disk): transient, so ask again rather than record it.
      if (answer.result?.reason === "agent_error") throw new Error(`preflight agent error: ${answer.result.detail}`);
      await handleOnce(ctx.orm, "apps-builds.preflight", msg, async (em) => {
        const app = await em.findOne(App, { id: request.app_id });
        const applied = !!app && applyPreflightAnswer(app, request.nonce, answer);
        if (applied) ctx.logger.info({ app: app!.appName, branch: app!.branch, status: answer.status }, "preflight answered");
        announcePreflightChecked(em, request, { status: "completed", preflight_status: answer.status, message: preflightOutcome(answer, applied, app) });
      });
    },
  });
  return {
    async stop() {
      stopping.abort(new Error("preflight worker stopping"));
      await consumer.stop();
    },
  };
}
