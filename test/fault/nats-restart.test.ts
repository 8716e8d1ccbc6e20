/**
 * Fault injection: the NATS server stopped and started again (its JetStream store kept, as a
 * restarted server or a rolling upgrade keeps it) while the platform is in use. The fleet runs on
 * a NATS server of its own here, so stopping it touches nothing else on the machine.
 * - a deployed app keeps answering through the router while NATS is down;
 * - builds asked for while NATS is down are accepted (they wait in the outbox) and, once it is
 *   back, are queued, claimed and built: every service and the agent found their consumers again;
 * - afterwards a new commit is built and deployed end to end, and its log lines arrive.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, natsServerBin, probeNats } from "@platform/fleet";
import { startTestFleet, type TestFleet } from "@platform/testing";
import type { FixtureRepo } from "../fixtures/git.ts";
import { call, viaRouter, waitFor } from "../e2e/support.ts";
import { APP, acmeTenant, buildFinished, deployedTag, registeredWeb, type Tenant } from "./support.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A nats-server with JetStream on a free port, its store under `storeDir`; restartable on the same port and store. */
class PrivateNats {
  #child: ChildProcess | undefined;
  readonly port: number;
  readonly storeDir: string;

  constructor(port: number, storeDir: string) {
    this.port = port;
    this.storeDir = storeDir;
  }

  get url() {
    return `nats://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    const bin = natsServerBin();
    if (!bin) throw new Error("nats-server is not installed");
    const child = spawn(bin, ["-js", "-sd", this.storeDir, "-a", "127.0.0.1", "-p", String(this.port)], { stdio: "ignore" });
    this.#child = child;
    const probe = await waitFor(() => probeNats(this.url, 1000), (p) => p.ok || child.exitCode !== null, 15_000);
    if (!probe.ok) throw new Error(`nats-server on ${this.url} did not start: ${probe.reason}`);
  }

  async stop(): Promise<void> {
    const child = this.#child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    child.kill("SIGTERM");
    await Promise.race([exited, sleep(10_000).then(() => child.kill("SIGKILL"))]);
  }
}

let nats: PrivateNats;
let storeRoot: string;
let fleet: TestFleet;
let t: Tenant;
let api: string;
let acme: string;
let web: FixtureRepo;
let serverJs: string;

beforeAll(async () => {
  storeRoot = await mkdtemp(path.join(os.tmpdir(), "platform-fault-nats-"));
  nats = new PrivateNats(await freePort(), storeRoot);
  await nats.start();
  fleet = await startTestFleet({ natsUrl: nats.url });
  t = await acmeTenant(fleet);
  ({ api, key: acme } = t);
  ({ repo: web, serverJs } = await registeredWeb(t));
});

afterAll(async () => {
  await fleet?.stop();
  await nats?.stop();
  await web?.cleanup();
  if (storeRoot) await rm(storeRoot, { recursive: true, force: true });
});

describe("NATS stopped and started again", () => {
  let url: string;

  it("a deployed app keeps answering while NATS is down, and builds asked for meanwhile run once it is back", async () => {
    const first = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
    expect((await deployedTag(t, first.body.tag)).status).toBe("completed");
    // The app's URLs follow the deploy's end through an event, a moment after it.
    url = (await waitFor(async () => (await call(api, "GET", `/apps/${APP}`, { credential: acme })).body.urls as string[], (urls) => urls.length > 0))[0]!;
    expect(await viaRouter(url)).toMatchObject({ status: 200, body: "hello from node-web (/)\n" });

    await nats.stop();
    const accepted: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: false } });
      expect(r.status).toBe(202);
      accepted.push(r.body.build_id);
      expect(await viaRouter(url)).toMatchObject({ status: 200, body: "hello from node-web (/)\n" });
      await sleep(1000);
    }
    await nats.start();

    for (const id of accepted) expect(await buildFinished(t, id)).toMatchObject({ status: "completed", commit_hash: web.head });
  });

  it("afterwards builds and deploys a new commit end to end, and its log lines arrive", async () => {
    await web.commit("after the outage", { "server.js": serverJs.replace("hello from node-web", "hello again from node-web") });
    const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
    expect(b.status).toBe(202);
    expect(await deployedTag(t, b.body.tag)).toMatchObject({ status: "completed", error_message: null });
    expect(await viaRouter(url)).toMatchObject({ status: 200, body: "hello again from node-web (/)\n" });
    const lines = await waitFor(
      async () => (await call(api, "GET", `/logs?build_id=${b.body.build_id}&source=build&since=1h`, { credential: acme })).body.logs as Array<{ message: string }>,
      (ls) => ls.some((l) => /^Image .* stored/.test(l.message)),
      30_000,
    );
    expect(lines.length).toBeGreaterThan(0);
  });
});
