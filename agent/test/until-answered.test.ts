/**
 * The agent's calls to a service that restarts: made again until the service answers (over a
 * real Connect client and server on loopback), never again after a 4xx, and not past their time.
 */
import { afterEach, describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { PlatformError } from "@platform/errors";
import { createLogger } from "@platform/logger";
import { DeployQueueService, ReadinessResponseSchema } from "@platform/proto";
import { createServiceClient, startRpcServer, type RpcServer } from "@platform/rpc";
import { freePort } from "@platform/testing";
import { untilAnswered } from "../src/until-answered.ts";

const logger = createLogger({ service: "until-answered-test", level: "silent", pretty: false });
const servers: RpcServer[] = [];

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

/** A deploy-queue stand-in whose readiness answers with `answer` (or throws it). */
async function queueOn(port: number, answer: () => boolean): Promise<RpcServer> {
  const server = await startRpcServer({
    port,
    host: "127.0.0.1",
    logger,
    readiness: async () => ({ ready: true }),
    routes: (router) =>
      router.service(DeployQueueService, {
        readiness: () => create(ReadinessResponseSchema, { service: "deploy-queue", ready: answer() }),
      }),
  });
  servers.push(server);
  return server;
}

describe("untilAnswered", () => {
  it("waits out a service that is not listening yet, then takes its answer", async () => {
    const port = await freePort();
    const client = createServiceClient(DeployQueueService, `http://127.0.0.1:${port}`);
    const retries: number[] = [];
    setTimeout(() => void queueOn(port, () => true), 700);
    const answer = await untilAnswered(() => client.readiness({}), { forMs: 10_000, onRetry: (_err, attempt) => retries.push(attempt) });
    expect(answer.ready).toBe(true);
    expect(retries.length).toBeGreaterThan(0);
  });

  it("gives up once its time is over, with the last failure", async () => {
    const client = createServiceClient(DeployQueueService, `http://127.0.0.1:${await freePort()}`);
    const started = Date.now();
    await expect(untilAnswered(() => client.readiness({}), { forMs: 600 })).rejects.toThrow(/unavailable|ECONNREFUSED/i);
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it("takes a 4xx as final: the service has answered", async () => {
    const port = await freePort();
    await queueOn(port, () => {
      throw PlatformError.conflict({ code: "not_claimed", message: "not yours" });
    });
    const client = createServiceClient(DeployQueueService, `http://127.0.0.1:${port}`);
    let calls = 0;
    await expect(
      untilAnswered(() => {
        calls++;
        return client.readiness({});
      }),
    ).rejects.toThrow(/not yours/);
    expect(calls).toBe(1);
  });

  it("stops trying when the agent is stopping", async () => {
    const client = createServiceClient(DeployQueueService, `http://127.0.0.1:${await freePort()}`);
    let calls = 0;
    await expect(
      untilAnswered(
        () => {
          calls++;
          return client.readiness({});
        },
        { stopping: () => calls >= 2 },
      ),
    ).rejects.toThrow();
    expect(calls).toBe(2);
  });
});
