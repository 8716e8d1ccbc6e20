/**
 * Agent RPCs with a heartbeat, over the machine's real NATS: the requester gets the answer after
 * any number of "working" messages, gives up on an agent gone silent long before its timeout,
 * fails at once when no agent listens, and stops when its signal aborts.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { testNatsUrl, uniquePrefix, deleteBusStreams } from "@platform/testing";
import { AgentSilentError, answerWorking, connectBus, requestOfAgent, type Bus } from "../src/index.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const prefix = uniquePrefix("trpc");
let agent: Bus;
let requester: Bus;

beforeAll(async () => {
  agent = await connectBus({ url: testNatsUrl(), name: "agent-rpc-test-agent", prefix });
  requester = await connectBus({ url: testNatsUrl(), name: "agent-rpc-test-requester", prefix });
  const sub = agent.nc.subscribe(agent.subject("agent.rpc.any.test"));
  void (async () => {
    for await (const msg of sub) {
      const { work, ms } = msg.json<{ work: string; ms: number }>();
      // An agent that dies holding the request: one "working", then nothing.
      if (work === "die") {
        void answerWorking(msg, () => new Promise(() => undefined));
        continue;
      }
      void answerWorking(msg, () => sleep(ms), 100).then(() => msg.respond(JSON.stringify({ done: work })));
    }
  })();
  await agent.nc.flush();
});

afterAll(async () => {
  await agent?.close();
  await requester?.close();
  await deleteBusStreams(prefix);
});

const ask = (body: unknown, opts: { timeoutMs?: number; silenceMs?: number; signal?: AbortSignal } = {}) =>
  requestOfAgent(requester.nc, requester.subject("agent.rpc.any.test"), JSON.stringify(body), { timeoutMs: 10_000, silenceMs: 500, ...opts });

it("returns the answer after the agent's working messages, however long the work beyond the silence limit", async () => {
  const reply = await ask({ work: "long", ms: 1_500 });
  expect(reply.json()).toEqual({ done: "long" });
});

it("gives up on an agent gone silent after the silence limit, not the timeout", async () => {
  const started = Date.now();
  await expect(ask({ work: "die" }, { timeoutMs: 60_000 })).rejects.toBeInstanceOf(AgentSilentError);
  expect(Date.now() - started).toBeLessThan(10_000);
});

it("gives up on work longer than the timeout, though the agent says it works", async () => {
  await expect(ask({ work: "endless", ms: 5_000 }, { timeoutMs: 1_000 })).rejects.toThrow(/worked on it for more than 1000 ms/);
});

it("fails at once when no agent listens", async () => {
  await expect(requestOfAgent(requester.nc, requester.subject("agent.rpc.any.nobody"), "{}", { timeoutMs: 10_000 })).rejects.toThrow(/no responders/i);
});

it("stops when its signal aborts", async () => {
  const stop = new AbortController();
  const asked = ask({ work: "aborted", ms: 5_000 }, { signal: stop.signal });
  await sleep(200);
  stop.abort(new Error("stopping"));
  await expect(asked).rejects.toThrow("stopping");
});
