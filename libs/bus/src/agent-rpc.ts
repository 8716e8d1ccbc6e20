/**
 * Fast agent RPCs (GIT_PREFLIGHT) over NATS request/reply, with a heartbeat. A plain request to
 * an agent that died holding it waits out the whole timeout, which must be longer than the
 * agent's own git timeouts. So the agent says "working" at once and again every
 * AGENT_RPC_WORKING_MS until it answers, and the requester gives up on an agent silent for
 * AGENT_RPC_SILENCE_MS: the request is then asked again, of an agent that is alive.
 */
import { headers as natsHeaders, type Msg, type NatsConnection } from "@nats-io/nats-core";

const AGENT_RPC_WORKING_MS = 5_000;
/** Three missed "working" messages, and a little more for a busy event loop. */
const AGENT_RPC_SILENCE_MS = 3 * AGENT_RPC_WORKING_MS + 2_000;
/** Marks the agent's "working" messages; the answer is the one message without it. */
export const AGENT_RPC_WORKING_HEADER = "Platform-Agent-Working";

function sayWorking(msg: Msg): void {
  const h = natsHeaders();
  h.set(AGENT_RPC_WORKING_HEADER, "1");
  try {
    msg.respond(undefined, { headers: h });
  } catch {
    // The connection is closing: the requester hears silence and asks again.
  }
}

/** Runs `work` for the request `msg`, telling its requester the agent is working until it settles. */
export async function answerWorking<T>(msg: Msg, work: () => Promise<T>, everyMs = AGENT_RPC_WORKING_MS): Promise<T> {
  if (!msg.reply) return work();
  sayWorking(msg);
  const timer = setInterval(() => sayWorking(msg), everyMs);
  try {
    return await work();
  } finally {
    clearInterval(timer);
  }
}

export class AgentSilentError extends Error {
  override name = "AgentSilentError";
}

/**
 * Asks an agent and returns its answer. Rejects with NoRespondersError when no agent listens,
 * with AgentSilentError when the agent that took the request stops saying it works (or works
 * longer than `timeoutMs` in all), and when `signal` aborts.
 */
export async function requestOfAgent(
  nc: NatsConnection,
  subject: string,
  data: string,
  opts: { timeoutMs: number; silenceMs?: number; signal?: AbortSignal },
): Promise<Msg> {
  const silenceMs = opts.silenceMs ?? AGENT_RPC_SILENCE_MS;
  const deadline = Date.now() + opts.timeoutMs;
  const replies = await nc.requestMany(subject, data, { strategy: "stall", stall: silenceMs, maxWait: silenceMs });
  const aborted = new Promise<never>((_, reject) => {
    const abort = () => reject(opts.signal?.reason ?? new Error("aborted"));
    if (opts.signal?.aborted) abort();
    else opts.signal?.addEventListener("abort", abort, { once: true });
  });
  aborted.catch(() => undefined);
  const it = replies[Symbol.asyncIterator]();
  try {
    for (;;) {
      const next = await Promise.race([it.next(), aborted]);
      if (next.done) throw new AgentSilentError(`the agent that took ${subject} went silent for ${silenceMs} ms`);
      if (!next.value.headers?.has(AGENT_RPC_WORKING_HEADER)) return next.value;
      if (Date.now() > deadline) throw new AgentSilentError(`the agent that took ${subject} worked on it for more than ${opts.timeoutMs} ms`);
    }
  } finally {
    // Not awaited: after an abort a next() is still pending, and the return queues behind it
    // until the silence limit ends the request. Otherwise it ends the request at once.
    void it.return?.(undefined);
  }
}
