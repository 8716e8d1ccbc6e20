/**
 * Fault injection: a control-plane service killed (SIGKILL) while an agent does the work it was
 * given. The agent goes on; what it reports waits on the bus (log lines in the LOGS stream, action
 * progress in the work events) until the service is back, which then takes it exactly once:
 * - health-aggregator killed while a build prints: every line of the build is stored, once;
 * - apps-builds killed while a build runs: the build is recorded completed, with its commit;
 * - deploy-queue killed during a deploy's health check: the deployment completes and the app
 *   serves the new release;
 * - and the agent itself killed for good during a deploy: the queue fails the deployment once
 *   the agent has been silent long enough (minutes), saying why while it waits.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { FIXTURES_DIR, type FixtureRepo } from "../fixtures/git.ts";
import { call, viaRouter, waitFor } from "../e2e/support.ts";
import { APP, acmeTenant, buildFinished, registeredWeb, type Tenant } from "./support.ts";

const LINES = 60;
/** A build that prints LINES numbered lines, 50 ms apart. */
const COUNT_JS = `let i = 0;\nconst t = setInterval(() => {\n  console.log("count " + ++i);\n  if (i === ${LINES}) clearInterval(t);\n}, 50);\n`;
const LISTEN = "server.listen(port, () => console.log(`node-web listening on ${port}`));";

let fleet: TestFleet;
let t: Tenant;
let api: string;
let acme: string;
let web: FixtureRepo;
let serverJs: string;

beforeAll(async () => {
  // A dead agent's action fails 30 s after its last report, not 3 minutes: its host must still
  // be silent for the live window (60 s) first.
  fleet = await startTestFleet({ env: { ORPHANED_ACTION_AFTER_S: "30" } });
  t = await acmeTenant(fleet);
  ({ api, key: acme } = t);
  const config = await readFile(path.join(FIXTURES_DIR, "node-web", "platform.yaml"), "utf8");
  expect(config).toContain("build: node build.js");
  ({ repo: web, serverJs } = await registeredWeb(t, { "count.js": COUNT_JS, "platform.yaml": config.replace("build: node build.js", "build: node count.js") }));
});

afterAll(async () => {
  await fleet?.stop();
  await web?.cleanup();
});

/** Starts a build and resolves once its build command runs on the agent. */
async function buildRunning(autoDeploy: boolean): Promise<{ buildId: string; tag: string }> {
  const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: autoDeploy } });
  expect(b.status).toBe(202);
  await waitFor(async () => (await call(api, "GET", `/deployments/queue/${b.body.action_id}`, { credential: acme })).body.phase, (p) => p === "build:web", 60_000);
  return { buildId: b.body.build_id, tag: b.body.tag };
}

/** The deployment of `tag` once it waits for its health check. */
async function inHealthCheck(tag: string): Promise<string> {
  return waitFor(
    async () =>
      (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.items.find(
        (d: any) => d.image_tag === tag && d.status === "setup_in_progress" && d.phase === "health_check",
      )?.id as string | undefined,
    (id) => !!id,
    120_000,
  ) as Promise<string>;
}

describe("a service killed while the agent works", () => {
  it("health-aggregator killed while a build prints: every line is stored once", async () => {
    const { buildId } = await buildRunning(false);
    await fleet.restart("health-aggregator");
    expect((await buildFinished(t, buildId)).status).toBe("completed");
    const counted = async () => {
      const r = await call(api, "GET", `/logs?build_id=${buildId}&source=build&limit=1000&since=1h`, { credential: acme });
      expect(r.status).toBe(200);
      return (r.body.logs as Array<{ message: string }>).map((l) => l.message).filter((m) => /^count \d+$/.test(m));
    };
    const lines = await waitFor(counted, (ls) => ls.length >= LINES, 30_000);
    expect(lines.map((m) => Number(m.slice("count ".length))).sort((a, b) => a - b)).toEqual(Array.from({ length: LINES }, (_, i) => i + 1));
  });

  it("apps-builds killed while a build runs: the build is recorded completed, with its commit", async () => {
    const { buildId } = await buildRunning(false);
    await fleet.restart("apps-builds");
    const build = await buildFinished(t, buildId);
    expect(build).toMatchObject({ status: "completed", commit_hash: web.head, error_message: null });
    expect(build.completed_at).toEqual(expect.any(String));
    const { log } = (await call(api, "GET", `/builds/id/${buildId}/logs`, { credential: acme })).body;
    expect(log).toContain(`count ${LINES}`);
    expect((await call(api, "GET", `/apps/${APP}`, { credential: acme })).body).toMatchObject({ last_build_status: "completed" });
  });

  it("deploy-queue killed during a deploy's health check: the deploy completes and the app serves it", async () => {
    expect(serverJs).toContain(LISTEN);
    await web.commit("slow start", {
      "server.js": serverJs.replace("hello from node-web", "hello after the fault from node-web").replace(LISTEN, `setTimeout(() => ${LISTEN.slice(0, -1)}, 4000);`),
    });
    const { tag } = await buildRunning(true);
    const deployId = await inHealthCheck(tag);
    await fleet.restart("deploy-queue");
    const done = await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body, (d) => ["completed", "failed", "cancelled"].includes(d.status), 90_000);
    expect(done).toMatchObject({ status: "completed", image_tag: tag, error_message: null });
    const app = await waitFor(async () => (await call(api, "GET", `/apps/${APP}`, { credential: acme })).body, (a) => a.running_version === tag, 30_000);
    expect(app).toMatchObject({ deploy_status: "running", last_deploy_status: "completed" });
    const answer = await viaRouter(app.urls[0]);
    expect(answer).toMatchObject({ status: 200, body: "hello after the fault from node-web (/)\n" });
  });

  // Last: the fleet has no agent afterwards.
  it("the agent killed for good during a deploy: stuck_class says so while it waits, then it fails naming the host, and the app keeps serving", async () => {
    const url = (await call(api, "GET", `/apps/${APP}`, { credential: acme })).body.urls[0] as string;
    const serving = await viaRouter(url);
    expect(serving.status).toBe(200);
    await web.commit("never answers", { "server.js": serverJs.replace(LISTEN, `setTimeout(() => ${LISTEN.slice(0, -1)}, 600000);`) });
    const { tag } = await buildRunning(true);
    const deployId = await inHealthCheck(tag);
    // Killed once its lines so far are shipped (the agent sends them in batches, 200 ms apart): what a
    // dead agent had not sent yet is lost with it.
    await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}/logs`, { credential: acme })).body.phases.length, (n) => n >= 2, 30_000);
    const agent = fleet.processes.find((p) => p.name === "agent")!;
    process.kill(agent.pid!, "SIGKILL");
    // It waits claimed by a host that no longer answers: in progress, not never claimed.
    await waitFor(async () => (await call(api, "GET", `/deployments/queue/${deployId}`, { credential: acme })).body.stuck_class, (c) => c === "in_progress", 120_000);
    const done = await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body, (d) => d.status !== "setup_in_progress", 300_000);
    expect(done).toMatchObject({ status: "failed", error_message: expect.stringMatching(/^The agent on host \S+ stopped responding during the action .*; it was failed after 30 s without progress\.$/) });
    // The agent never reported its end: the phases come from the lines it shipped before it died.
    const phases = (await call(api, "GET", `/deployments/${deployId}/logs`, { credential: acme })).body.phases.map((p: { name: string }) => p.name);
    expect(phases).toEqual(expect.arrayContaining(["setup", "start"]));
    expect(await viaRouter(url)).toEqual(serving);
    expect((await call(api, "GET", `/apps/${APP}`, { credential: acme })).body).toMatchObject({ last_deploy_status: "failed", deploy_warning: expect.stringContaining("still serves") });
  }, 420_000);
});
