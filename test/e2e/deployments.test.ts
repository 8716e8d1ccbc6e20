/**
 * Deployments through HTTP only (spec doc 1 sections 2.1, 2.4, 3.2, 4.4, 4.5, 4.6; doc 2 section
 * 4.10): a real agent builds the fixture app, starts it as a process, health-checks it and routes
 * it through a real Caddy; then a client requests its URL through the router. A second commit is
 * deployed while a client keeps requesting (no failed request across the swap), a crashing
 * release fails with its crash output while the older one keeps serving, cancel answers at each
 * point of the lifecycle, services stop and start, the app keeps running through a rename of its
 * group (and is undeployed under the new slug), and undeploy takes the URL away.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { makeFixtureRepo, webConfigBuiltBy, type FixtureRepo } from "../fixtures/git.ts";
import { call, viaRouter, waitFor } from "./support.ts";

let fleet: TestFleet;
let api: string;
let acme: string;
let globex: string;
let web: FixtureRepo;
let serverJs: string;

const APP = "node-web";

async function key(f: TestFleet, group: string, scope = "admin") {
  await call(f.api, "POST", "/groups", { credential: f.rootKey, body: { slug: group } });
  return (await call(f.api, "POST", "/keys", { credential: f.rootKey, body: { name: group, scope, group } })).body.key as string;
}

const getApp = async () => (await call(api, "GET", `/apps/${APP}`, { credential: acme })).body;

/** The app row follows the queue through events: wait until it has seen deployment `id` finish. */
const appAfter = async (status: string) => waitFor(getApp, (a) => a.last_deploy_status === status);

/** Builds HEAD with auto-deploy; resolves with the build and its deploy once the deploy is terminal. */
/** Runs `check` with the fixture's build made `seconds` slower, then commits its config back. */
async function withSlowBuild(seconds: number, check: () => Promise<void>): Promise<void> {
  const config = await readFile(path.join(web.dir, "platform.yaml"), "utf8");
  await web.commit("a slow build", { "platform.yaml": webConfigBuiltBy(`sleep ${seconds} && node build.js`) });
  try {
    await check();
  } finally {
    await web.commit("the fixture's config again", { "platform.yaml": config });
  }
}

async function buildAndDeploy(): Promise<{ tag: string; buildId: string; deploy: Record<string, any> }> {
  const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
  expect(b.status).toBe(202);
  const deployId = await waitFor(
    async () => (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.items.find((d: any) => d.image_tag === b.body.tag)?.id,
    (id) => !!id,
  );
  const deploy = await waitFor(
    async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body,
    (d) => ["completed", "failed", "cancelled"].includes(d.status),
    120_000,
  );
  return { tag: b.body.tag, buildId: b.body.build_id, deploy };
}

const LISTEN = "server.listen(port, () => console.log(`node-web listening on ${port}`));";

/**
 * Commits a server that starts listening only `ms` after it starts, builds it with auto-deploy,
 * and resolves with its deploy's id once that deploy waits in its health check.
 */
async function deployWaitingForHealth(message: string, ms: number): Promise<string> {
  expect(serverJs).toContain(LISTEN);
  await web.commit(message, { "server.js": serverJs.replace(LISTEN, `setTimeout(() => ${LISTEN.slice(0, -1)}, ${ms});`) });
  const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
  return waitFor(
    async () => (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.items.find((d: any) => d.image_tag === b.body.tag && d.status === "setup_in_progress" && d.phase === "health_check")?.id as string | undefined,
    (id) => !!id,
    120_000,
  ) as Promise<string>;
}

beforeAll(async () => {
  fleet = await startTestFleet();
  api = fleet.api;
  acme = await key(fleet, "acme");
  globex = await key(fleet, "globex");
  web = await makeFixtureRepo("node-web");
  serverJs = await readFile(path.join(web.dir, "server.js"), "utf8");
  expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: APP, repository: web.url } })).status).toBe(201);
  await waitFor(async () => (await getApp()).preflight_status, (s) => s === "ready");
  expect((await call(api, "PUT", `/vars/${APP}`, { credential: acme, body: { branch: "main", variables: { GREETING: "hello-vars" } } })).status).toBe(200);
});

afterAll(async () => {
  await fleet?.stop();
  await web?.cleanup();
});

describe("a build deployed by the agent", () => {
  let first: Awaited<ReturnType<typeof buildAndDeploy>>;

  it("runs the app behind the router: its URL answers", async () => {
    first = await buildAndDeploy();
    expect(first.deploy).toMatchObject({ status: "completed", app_name: APP, branch: "main", image_tag: first.tag, action_type: "DEPLOY", error_message: null });
    const app = await appAfter("completed");
    const url = `http://${APP}.dev.localhost:${fleet.routerPort}`;
    expect(app).toMatchObject({
      deploy_status: "running",
      running_version: first.tag,
      running_build_id: first.buildId,
      urls: [url],
      services: [{ name: "web", url }],
      last_deploy_status: "completed",
      last_deploy_error: null,
      last_build_status: "completed",
      deploy_warning: null,
    });
    expect(app.running_since).toEqual(expect.any(String));
    const res = await viaRouter(`${url}/some/path`);
    expect(res).toEqual({ status: 200, body: "hello from node-web (/some/path)\n" });
    expect((await viaRouter(`${url}/build-info`)).body).toMatch(/^built by build\.js at /);
  });

  it("lists the deployment, its phases and its immutable history with the variables it ran with", async () => {
    const id = first.deploy.id;
    const list = await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme });
    expect(list.body.items.map((d: any) => d.id)).toContain(id);
    // The app's canonical name lists what its slug lists, as POST /api/deployments takes it.
    const canonical = await call(api, "GET", `/deployments?app_name=${encodeURIComponent("Node Web")}`, { credential: acme });
    expect(canonical.body.items.map((d: any) => d.id)).toEqual(list.body.items.map((d: any) => d.id));
    expect((await call(api, "GET", `/deployments/history?app_name=NODE_WEB`, { credential: acme })).body.total).toBeGreaterThan(0);
    // A branch narrows both, as on the builds list.
    const ofMain = await call(api, "GET", `/deployments?app_name=${APP}&branch=main`, { credential: acme });
    expect(ofMain.body.items.map((d: any) => d.id)).toEqual(list.body.items.map((d: any) => d.id));
    expect((await call(api, "GET", `/deployments?app_name=${APP}&branch=elsewhere`, { credential: acme })).body).toEqual({ items: [], total: 0 });
    expect((await call(api, "GET", `/deployments/history?app_name=${APP}&branch=elsewhere`, { credential: acme })).body).toEqual({ items: [], total: 0 });
    // Operator-only fields are present and null for a tenant; an operator sees them.
    expect(first.deploy).toMatchObject({ placement_plan: null, instance_status: null, leader_instance: null, infrastructure: null, previous_tag: null });
    const asRoot = await call(api, "GET", `/deployments/${id}`, { credential: fleet.rootKey });
    expect(asRoot.body.leader_instance).toEqual(expect.any(String));
    expect(asRoot.body.infrastructure).toMatchObject({ runtime: "process" });

    const logs = await call(api, "GET", `/deployments/${id.slice(0, 8)}/logs`, { credential: acme });
    expect(logs.status).toBe(200);
    expect(logs.body.phases.map((p: any) => p.name)).toEqual(["setup", "start", "health_check", "ready", "swap_committed", "drain"]);
    expect(logs.body.phases.find((p: any) => p.name === "health_check").output).toContain("answers /healthz");
    expect(logs.body.error_message).toBeNull();

    const history = await call(api, "GET", `/deployments/history?app_name=${APP}`, { credential: acme });
    expect(history.body.items[0]).toMatchObject({ deployment_id: id, status: "completed", image_tag: first.tag, env_vars_snapshot: { GREETING: "hello-vars" } });
    expect(history.body.items[0].duration_seconds).toEqual(expect.any(Number));
    // The variables, secrets, are shown there alone: not by the queue's view of the action.
    for (const credential of [acme, fleet.rootKey]) {
      const queued = await call(api, "GET", `/deployments/queue/${id}?group=acme`, { credential });
      expect(queued.status).toBe(200);
      expect(JSON.stringify(queued.body)).not.toContain("hello-vars");
    }
    // Slugs are lower case: NODE-WEB names the app node-web, as in every other route.
    expect((await call(api, "GET", `/deployments?app_name=${APP.toUpperCase()}`, { credential: acme })).body).toEqual(list.body);
    expect((await call(api, "GET", `/deployments/history?app_name=${APP.toUpperCase()}`, { credential: acme })).body).toEqual(history.body);
  });

  it("ships deploy and container logs", async () => {
    await expect
      .poll(async () => (await call(api, "GET", `/logs?app_name=${APP}&source=deploy&deployment_id=${first.deploy.id}`, { credential: acme })).body.logs.length, { timeout: 20_000 })
      .toBeGreaterThan(0);
    await expect
      .poll(async () => (await call(api, "GET", `/logs?app_name=${APP}&source=container&search=listening`, { credential: acme })).body.logs.map((l: any) => l.message), { timeout: 20_000 })
      .toContainEqual(expect.stringMatching(/^node-web listening on \d+$/));
    // A replica's output carries the deployment that started it: one release's output is found by its id.
    const ofRelease = await call(api, "GET", `/logs?source=container&deployment_id=${first.deploy.id}&search=listening`, { credential: acme });
    expect(ofRelease.body.logs[0]).toMatchObject({ deployment_id: first.deploy.id, message: expect.stringMatching(/^node-web listening on \d+$/) });
    // Ids are taken as everywhere else: a prefix of 8 or more characters names the one it starts.
    const byPrefix = async (param: string, id: string) => (await call(api, "GET", `/logs?${param}=${id}`, { credential: acme })).body;
    expect((await byPrefix("deployment_id", first.deploy.id.slice(0, 8))).total).toBe((await byPrefix("deployment_id", first.deploy.id)).total);
    expect((await byPrefix("action_id", first.deploy.id.slice(0, 13))).total).toBe((await byPrefix("action_id", first.deploy.id)).total);
    const buildLines = (await byPrefix("build_id", first.buildId)).total;
    expect(buildLines).toBeGreaterThan(0);
    expect((await byPrefix("build_id", first.buildId.slice(0, 8))).total).toBe(buildLines);
    expect((await call(api, "GET", `/logs?deployment_id=${first.deploy.id.slice(0, 7)}`, { credential: acme })).status).toBe(422);
    expect(await call(api, "GET", `/logs?deployment_id=${first.deploy.id.slice(0, 8)}`, { credential: globex })).toMatchObject({ status: 200, body: { logs: [], total: 0 } });
    const empty = (q: string) => call(api, "GET", `/logs?app_name=${APP}&source=container&${q}`, { credential: acme });
    expect((await empty("service_name=nope")).body).toMatchObject({ logs: [], reason: "no_log_group" });
    expect((await empty("search=nothing-says-this")).body).toMatchObject({ logs: [], reason: "no_output_yet" });
  });

  it("swaps to a new commit with no failed request", async () => {
    await web.commit("v2", { "server.js": serverJs.replace("hello from node-web", "hello v2 from node-web") });
    const url = (await getApp()).urls[0] as string;
    const seen: string[] = [];
    const failures: string[] = [];
    let stop = false;
    const loop = (async () => {
      while (!stop) {
        try {
          const r = await viaRouter(`${url}/`);
          if (r.status === 200) seen.push(r.body);
          else failures.push(`${r.status} ${r.body}`);
        } catch (err) {
          failures.push(String(err));
        }
      }
    })();
    const second = await buildAndDeploy();
    await new Promise((r) => setTimeout(r, 300));
    stop = true;
    await loop;
    expect(second.deploy.status, second.deploy.error_message).toBe("completed");
    expect(failures).toEqual([]);
    expect(seen[0]).toBe("hello from node-web (/)\n");
    expect(seen.at(-1)).toBe("hello v2 from node-web (/)\n");
    expect(second.deploy.previous_tag).toBe(first.tag);
    expect(await waitFor(getApp, (a) => a.running_version === second.tag)).toMatchObject({ running_version: second.tag, running_build_id: second.buildId, deploy_status: "running" });
  });

  it("fails a release that crashes during its health checks, with its crash output, while the older one keeps serving", async () => {
    const before = await getApp();
    await web.commit("crash", {
      "server.js": 'console.log("starting");\nconsole.log("x".repeat(200000));\nconsole.error("fatal: GREETING is " + process.env.GREETING);\nprocess.exit(3);\n',
    });
    const crashed = await buildAndDeploy();
    // How it ended, exit code included: what to fix is in it.
    expect(crashed.deploy).toMatchObject({ status: "failed", error_message: "Service web exited with code 3 during the health checks." });
    const app = await appAfter("failed");
    expect(app).toMatchObject({
      deploy_status: "failed",
      running_version: before.running_version,
      last_deploy_status: "failed",
      last_deploy_error: expect.stringContaining("exited with code 3 during the health checks"),
      deploy_warning: expect.stringContaining(`${before.running_version} still serves`),
    });
    // A line is kept as a log line keeps it: 16 KiB, the rest cut and marked.
    const long = `${"x".repeat(16_384 - " … [truncated]".length)} … [truncated]`;
    expect(app.last_crash_output.web).toEqual(["starting", long, "fatal: GREETING is hello-vars"]);
    expect((await viaRouter(`${app.urls[0]}/`)).body).toBe("hello v2 from node-web (/)\n");
    const logs = await call(api, "GET", `/deployments/${crashed.deploy.id}/logs`, { credential: acme });
    expect(logs.body.crash_output).toEqual({ web: ["starting", long, "fatal: GREETING is hello-vars"] });
  });

  it("retries the failed deploy (409 when the latest did not fail) and redeploys the latest image", async () => {
    const retry = await call(api, "POST", `/apps/${APP}/retry`, { credential: acme });
    expect(retry.status).toBe(202);
    // The queue shows the commit the retry runs again, as for the deploy it retries.
    const queued = (await call(api, "GET", `/deployments/queue/${retry.body.action_id}`, { credential: acme })).body;
    expect(queued).toMatchObject({ action_type: "RETRY", commit_message: "crash", commit_author: expect.stringContaining("Platform Fixtures") });
    const done = await waitFor(async () => (await call(api, "GET", `/deployments/${retry.body.deployment_id}`, { credential: acme })).body, (d) => ["completed", "failed"].includes(d.status), 60_000);
    expect(done).toMatchObject({ action_type: "RETRY", status: "failed" });

    await web.commit("v3", { "server.js": serverJs.replace("hello from node-web", "hello v3 from node-web") });
    const v3 = await buildAndDeploy();
    expect(v3.deploy.status, v3.deploy.error_message).toBe("completed");
    expect((await call(api, "POST", `/apps/${APP}/retry`, { credential: acme })).body.detail.code).toBe("nothing_to_retry");

    const again = await call(api, "POST", `/apps/${APP}/redeploy`, { credential: acme });
    expect(again.status).toBe(202);
    expect(again.body).toMatchObject({ mode: "image", image_tag: v3.tag, status: "queued" });
    const redeployed = await waitFor(async () => (await call(api, "GET", `/deployments/${again.body.deployment_id}`, { credential: acme })).body, (d) => d.status === "completed", 60_000);
    expect(redeployed.previous_tag).toBe(v3.tag);
    // The redeploy queued no build (its build_id is null): a no-build deploy, so running_build_id
    // is not reported once it serves (spec 2.1 rule 5), though the tag is v3's.
    expect(again.body.build_id).toBeNull();
    // Running since its swap commit: after it was queued, by the time it completed (the old colour drained meanwhile).
    await expect.poll(async () => Date.parse((await getApp()).running_since) > Date.parse(redeployed.created_at), { timeout: 10_000 }).toBe(true);
    expect(Date.parse((await getApp()).running_since)).toBeLessThanOrEqual(Date.parse(redeployed.completed_at));
    expect(await getApp()).toMatchObject({ running_version: v3.tag, running_build_id: null });
  });

  it("refuses to queue a deployment of a service the release does not declare, or static-site settings for a container app, nothing queued", async () => {
    const before = (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.total;
    const undeclared = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP, services: ["web", "nope"] } });
    expect(undeclared).toMatchObject({ status: 400, body: { detail: { code: "service_not_declared", services: ["nope"] } } });
    // Doc 1 section 4.5: "400 validation", the schema's refusals included.
    const notNames = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP, services: [123] } });
    expect(notNames).toMatchObject({ status: 400, body: { detail: { code: "invalid_request", message: expect.stringContaining("services") } } });
    expect((await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP, replicas: 2 } })).status).toBe(400);
    expect((await call(api, "POST", "/deployments", { credential: acme, body: { branch: "main" } })).status).toBe(400);
    expect((await call(api, "POST", "/deployments?skip_preflight=perhaps", { credential: acme, body: { app_name: APP } })).status).toBe(400);
    const staticOnly = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP, spa_fallback: true } });
    expect(staticOnly).toMatchObject({ status: 400, body: { detail: { code: "static_site_fields", fields: ["spa_fallback"] } } });
    expect((await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.total).toBe(before);
    expect((await getApp()).deploy_status).toBe("running");
  });

  it("places a deploy on the host an operator's placement plan names; a tenant's plan is 403 and an unknown host 400, nothing queued", async () => {
    const before = (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.total;
    const tenant = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP, placement_plan: { host: "anywhere" } } });
    expect(tenant).toMatchObject({ status: 403, body: { detail: expect.stringContaining("placement_plan is for platform operators") } });
    const asOperator = (body: Record<string, unknown>) => call(api, "POST", "/deployments?group=acme", { credential: fleet.rootKey, body: { app_name: APP, ...body } });
    expect(await asOperator({ placement_plan: { host: "no-such-host" } })).toMatchObject({ status: 400, body: { detail: expect.stringContaining("no agent host") } });
    expect((await asOperator({ placement_plan: { zone: "eu" } })).status).toBe(400);
    expect((await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.total).toBe(before);

    const latest = (await call(api, "GET", `/deployments?app_name=${APP}&group=acme`, { credential: fleet.rootKey })).body.items[0];
    const host = Object.keys(latest.instance_status)[0]!;
    const placed = await asOperator({ placement_plan: { host } });
    expect(placed.status).toBe(202);
    const done = await waitFor(
      async () => (await call(api, "GET", `/deployments/${placed.body.deployment_id}?group=acme`, { credential: fleet.rootKey })).body,
      (d) => ["completed", "failed", "cancelled"].includes(d.status),
      60_000,
    );
    expect(done).toMatchObject({ status: "completed", placement_plan: { host }, instance_status: { [host]: "running" } });
    expect((await call(api, "GET", `/deployments/queue/${placed.body.deployment_id}`, { credential: fleet.rootKey })).body.deploy_warnings).toEqual([]);
    expect((await call(api, "GET", `/deployments/${placed.body.deployment_id}`, { credential: acme })).body.placement_plan).toBeNull();
  });
});

describe("save-config on a running app", () => {
  it("moves a service's URL to a mount saved with save-config only once a deploy routes it there", async () => {
    const saveMount = async (mount: string) => {
      const config = (await call(api, "GET", `/apps/${APP}/config`, { credential: acme })).body.effective;
      config.services.web.mount = mount;
      return call(api, "PUT", `/apps/${APP}/config`, { credential: acme, body: { config } });
    };
    const redeploy = async () => {
      await waitFor(async () => (await getApp()).preflight_status, (s) => s === "ready");
      const r = await call(api, "POST", `/apps/${APP}/redeploy`, { credential: acme });
      expect(r.status).toBe(202);
      await waitFor(async () => (await call(api, "GET", `/deployments/${r.body.deployment_id}`, { credential: acme })).body, (d) => d.status === "completed", 60_000);
    };
    const front = (await getApp()).urls[0] as string;
    const saved = await saveMount("/app");
    expect(saved.status).toBe(200);
    expect(saved.body).toMatchObject({ changed_paths: ["services.web.mount"], requires_redeploy: true });
    // Saved, not deployed: the router still serves web at the front door, and the app says so.
    expect((await getApp()).services).toEqual([{ name: "web", url: front }]);
    expect((await getApp()).urls).toEqual([front]);
    await redeploy();
    // The app row hears of the completed deploy through the queue's event, a moment later.
    await waitFor(getApp, (a) => a.services[0].url === `${front}/app`, 10_000);
    expect((await viaRouter(`${front}/app/x`)).status).toBe(200);
    expect((await saveMount("/")).status).toBe(200);
    await redeploy();
    await waitFor(getApp, (a) => a.urls.length === 1 && a.urls[0] === front, 10_000);
  });
});

describe("cancel", () => {
  it("cancels a queued deploy outright", async () => {
    // A slow build keeps its dependent deploy queued for long enough.
    await withSlowBuild(4, async () => {
      const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
      const deploy = await waitFor(
        async () => (await call(api, "GET", `/deployments/queue?app_name=${APP}`, { credential: acme })).body.find((a: any) => a.depends_on === b.body.build_id),
        (d) => !!d,
      );
      const running = (await getApp()).running_version as string;
      const r = await call(api, "POST", `/deployments/${deploy.action_id}/cancel`, { credential: acme, body: { reason: "not this one" } });
      expect(r.body).toMatchObject({ status: "cancelled", cancelled: true });
      // The reason given is the deployment's error, and the app's last one.
      expect((await call(api, "GET", `/deployments/${deploy.action_id}`, { credential: acme })).body).toMatchObject({ status: "cancelled", error_message: "Cancelled: not this one" });
      expect(await waitFor(getApp, (a) => a.last_deploy_status === "cancelled")).toMatchObject({ last_deploy_error: "Cancelled: not this one" });
      // The tag that served when it was queued, though no agent ever ran it.
      expect((await call(api, "GET", `/deployments/${deploy.action_id}`, { credential: acme })).body.previous_tag).toBe(running);
      await waitFor(async () => (await call(api, "GET", `/builds/id/${b.body.build_id}`, { credential: acme })).body.status, (s) => s === "completed", 90_000);
      expect((await call(api, "GET", `/deployments/${deploy.action_id}`, { credential: acme })).body.status).toBe("cancelled");
    });
  });

  it("stops an in-flight deploy before the swap, during its health check; the running version keeps serving", async () => {
    const serving = (await getApp()).running_version;
    // It would answer only long after the health check's timeout: the deploy ends cancelled, not failed.
    const deployId = await deployWaitingForHealth("slow", 600_000);
    // In flight, its phases so far are those its agent has shipped.
    const live = await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}/logs`, { credential: acme })).body, (l) => l.phases.length >= 2, 15_000);
    expect(live.phases.map((p: { name: string }) => p.name).slice(0, 2)).toEqual(["setup", "start"]);
    expect(live.phases[1].output).toMatch(/Started replica 1/);
    const r = await call(api, "POST", `/deployments/${deployId}/cancel`, { credential: acme });
    expect(r.body).toMatchObject({ status: "cancel_requested", cancel_requested: true });
    const done = await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body, (d) => ["completed", "failed", "cancelled"].includes(d.status), 60_000);
    expect(done).toMatchObject({ status: "cancelled", phase: "health_check" });
    expect(await appAfter("cancelled")).toMatchObject({ running_version: serving, deploy_status: "running" });
  });

  it("refuses past the point of no return and rolls forward", async () => {
    await web.commit("v4", { "server.js": serverJs.replace("hello from node-web", "hello v4 from node-web") });
    const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
    const deployId = await waitFor(
      async () =>
        (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.items.find(
          (d: any) =>
            d.image_tag === b.body.tag &&
            ((d.phase === "swap_committed" && d.status === "in_progress") || (d.phase === "drain" && d.status === "running")),
        )?.id,
      (id) => !!id,
      120_000,
    );
    const r = await call(api, "POST", `/deployments/${deployId}/cancel`, { credential: acme });
    expect(r.body.status).toBe("refused_past_point_of_no_return");
    const done = await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body, (d) => d.status === "completed", 60_000);
    expect(done.image_tag).toBe(b.body.tag);
    expect((await call(api, "POST", `/deployments/${deployId}/cancel`, { credential: acme })).body.status).toBe("not_cancellable");
    expect((await call(api, "POST", `/deployments/00000000-0000/cancel`, { credential: acme })).body.status).toBe("not_found");
  });
});

describe("services", () => {
  it("reports each service's runtime from the agents' heartbeats", async () => {
    const r = await call(api, "GET", `/services/${APP}`, { credential: acme });
    expect(r.status).toBe(200);
    expect(r.body.services).toEqual([
      { name: "web", status: "running", runtime: { replicas_running: 1, hosts_unverified: 0, reason: null }, url: expect.any(String), http_client: expect.stringMatching(/^(curl|python3|node)$/), capability_probed_at: expect.any(String) },
    ]);
  });

  it("stops and starts a service as SERVICE_ACTION rows", async () => {
    const url = (await getApp()).urls[0] as string;
    const stop = await call(api, "POST", `/services/${APP}/web/stop`, { credential: acme });
    expect(stop.status).toBe(202);
    expect(stop.body).toMatchObject({ services: ["web"], skipped_static: [], action: "stop" });
    await expect.poll(async () => (await call(api, "GET", `/services/${APP}`, { credential: acme })).body.services[0].status, { timeout: 30_000 }).toBe("not_running");
    expect((await viaRouter(`${url}/`)).status).toBe(503);
    const queue = await call(api, "GET", `/deployments/queue?app_name=${APP}&all=true`, { credential: acme });
    expect(queue.body.find((a: any) => a.action_id === stop.body.action_ids[0])).toMatchObject({ action_type: "SERVICE_ACTION", service_name: "web", action: "stop" });

    const start = await call(api, "POST", `/services/${APP}/start`, { credential: acme });
    expect(start.status).toBe(202);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
    // Starting a service that runs changes nothing, and is no failure.
    const again = await call(api, "POST", `/services/${APP}/web/start`, { credential: acme });
    expect(again.status).toBe(202);
    await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${again.body.action_ids[0]}`, { credential: acme })).body.status, { timeout: 30_000 }).toBe("completed");
    expect((await viaRouter(`${url}/`)).status).toBe(200);

    const restart = await call(api, "POST", `/services/${APP}/web/restart`, { credential: acme });
    expect(restart.status).toBe(202);
    await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${restart.body.action_ids[0]}`, { credential: acme })).body.status, { timeout: 30_000 }).toBe("completed");
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
    // Its log lines are found by its action id; a service action is no deployment.
    const lines = await waitFor(
      async () => (await call(api, "GET", `/logs?action_id=${restart.body.action_ids[0]}`, { credential: acme })).body.logs as any[],
      (ls) => ls.some((l) => /^Restarted replica 1$/.test(l.message)),
    );
    expect(lines.map((l) => [l.source, l.deployment_id])).toEqual(lines.map(() => ["deploy", null]));
    expect((await call(api, "POST", `/services/${APP}/nope/restart`, { credential: acme })).status).toBe(404);
  });

  it("acts only on services the running release has: one saved with save-config is 409 by name and skipped app-wide until a deploy", async () => {
    const saveConfig = async (edit: (config: any) => void) => {
      const config = (await call(api, "GET", `/apps/${APP}/config`, { credential: acme })).body.effective;
      edit(config);
      const r = await call(api, "PUT", `/apps/${APP}/config`, { credential: acme, body: { config } });
      expect(r.status).toBe(200);
      await waitFor(async () => (await getApp()).preflight_status, (s) => s === "ready");
    };
    await saveConfig((config) => (config.services.extra = { run: "sleep 600", background: true }));
    try {
      const named = await call(api, "POST", `/services/${APP}/extra/start`, { credential: acme });
      expect(named).toMatchObject({ status: 409, body: { detail: { code: "service_not_deployed" } } });
      const all = await call(api, "POST", `/services/${APP}/restart`, { credential: acme });
      expect(all.status).toBe(202);
      expect(all.body).toMatchObject({ services: ["web"], skipped_static: [], skipped_not_deployed: ["extra"] });
      expect(all.body.action_ids).toHaveLength(1);
      await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${all.body.action_ids[0]}`, { credential: acme })).body.status, { timeout: 30_000 }).toBe("completed");
    } finally {
      await saveConfig((config) => delete config.services.extra);
    }
  });

  it("reports a static app's services as served from the edge and refuses to act on them, built or not", async () => {
    const site = await makeFixtureRepo("node-web", { files: { "platform.yaml": "type: static\nservices:\n  site:\n    build: node build.js\nstatic:\n  dir: .\n" } });
    try {
      expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: "site", repository: site.url } })).status).toBe(201);
      await waitFor(async () => (await call(api, "GET", "/apps/site", { credential: acme })).body.preflight_status, (s) => s === "ready");
      const status = await call(api, "GET", "/services/site", { credential: acme });
      expect(status.body.services).toMatchObject([{ name: "site", status: "edge", runtime: { replicas_running: null, hosts_unverified: null, reason: null } }]);
      expect(await call(api, "POST", "/services/site/site/restart", { credential: acme })).toMatchObject({ status: 422, body: { detail: { code: "static_service" } } });
      expect(await call(api, "POST", "/services/site/stop", { credential: acme })).toMatchObject({ status: 422, body: { detail: { code: "all_static" } } });
    } finally {
      await call(api, "DELETE", "/apps/site", { credential: acme });
      await site.cleanup();
    }
  });

  it("restarts an app process that dies and logs the event", async () => {
    const url = (await getApp()).urls[0] as string;
    expect((await viaRouter(`${url}/crash`)).body).toBe("exiting\n");
    await expect
      .poll(async () => (await call(api, "GET", `/logs?app_name=${APP}&source=agent&search=restarted`, { credential: acme })).body.logs.length, { timeout: 30_000 })
      .toBeGreaterThan(0);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
  });
});

describe("recovery", () => {
  it("fails a deploy cleanly when its agent is killed before the swap, while the running app keeps serving", async () => {
    const app = await getApp();
    const url = app.urls[0] as string;
    const serving = (await viaRouter(`${url}/`)).body;
    const deployId = await deployWaitingForHealth("slow again", 8000);
    await fleet.restart("agent");
    expect(await viaRouter(`${url}/`)).toEqual({ status: 200, body: serving });
    const done = await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body, (d) => ["completed", "failed", "cancelled"].includes(d.status), 60_000);
    expect(done).toMatchObject({ status: "failed", error_message: expect.stringContaining("agent restarted during the deploy") });
    expect(done.error_message).toContain(`${app.running_version} kept serving`);
    // The phases the killed agent went through stay in the deployment's logs, with how it ended.
    const phases = (await call(api, "GET", `/deployments/${deployId}/logs`, { credential: acme })).body.phases.map((p: { name: string }) => p.name);
    expect(phases).toEqual(expect.arrayContaining(["setup", "start", "health_check", "resume"]));
    expect(await appAfter("failed")).toMatchObject({ running_version: app.running_version, deploy_warning: expect.stringContaining("still serves") });
    expect(await viaRouter(`${url}/`)).toEqual({ status: 200, body: serving });
    await expect.poll(async () => (await call(api, "GET", `/services/${APP}`, { credential: acme })).body.services[0].status, { timeout: 30_000 }).toBe("running");
  });
});

describe("recovery of a replica", () => {
  it("says the service runs again as soon as a restarted agent has brought back a replica that died meanwhile", async () => {
    const url = (await getApp()).urls[0] as string;
    expect((await viaRouter(`${url}/crash`)).body).toBe("exiting\n");
    await fleet.restart("agent");
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
    // Told in a heartbeat when the replica is back, not at the next one 30 s later.
    await expect.poll(async () => (await call(api, "GET", `/services/${APP}`, { credential: acme })).body.services[0], { timeout: 10_000 }).toMatchObject({
      status: "running",
      runtime: { replicas_running: 1 },
    });
  });
});

describe("scale, primary services and visibility", () => {
  const scale = (replicas: unknown) => call(api, "PATCH", `/apps/${APP}/services/web/replicas`, { credential: acme, body: { replicas } });
  const deployed = (id: string) => waitFor(async () => (await call(api, "GET", `/deployments/${id}`, { credential: acme })).body, (d) => ["completed", "failed"].includes(d.status), 60_000);

  it("scales to 3 replicas and back, refusing what is not an integer from 1 to 3 and a scale while one is in flight", async () => {
    for (const bad of ["2", true, 4, 0, 1.5]) expect((await scale(bad)).status, JSON.stringify(bad)).toBe(422);
    const up = await scale(3);
    expect(up.status).toBe(200);
    expect(up.body).toMatchObject({ app_name: APP, branch: "main", service: "web", previous: 1, requested: 3, action_id: expect.any(String), overlay_paths: ["services.web.replicas"] });
    const busy = await scale(2);
    expect(busy.status).toBe(409);
    expect(busy.body.detail).toMatchObject({ code: "scale_in_flight", action_id: up.body.action_id, action_type: "DEPLOY" });
    expect((await deployed(up.body.action_id)).status).toBe("completed");
    const logs = await call(api, "GET", `/deployments/${up.body.action_id}/logs`, { credential: acme });
    expect(logs.body.phases.find((p: any) => p.name === "start").output).toContain("Started replica 3");
    const config = await call(api, "GET", `/apps/${APP}/config`, { credential: acme });
    expect(config.body.effective.services.web.replicas).toBe(3);
    expect(config.body.source_map["services.web.replicas"]).toBe("dashboard");
    const url = (await getApp()).urls[0] as string;
    const bodies = new Set<string>();
    for (let i = 0; i < 6; i++) bodies.add((await viaRouter(`${url}/`)).body);
    expect(bodies.size).toBe(1);

    const down = await scale(1);
    expect(down.body).toMatchObject({ previous: 3, requested: 1 });
    expect((await deployed(down.body.action_id)).status).toBe("completed");
    await expect.poll(async () => (await scale(1)).body, { timeout: 30_000 }).toMatchObject({ action_id: null, previous: 1, requested: 1, deployed: 1 });
    expect((await call(api, "PATCH", `/apps/${APP}/services/nope/replicas`, { credential: acme, body: { replicas: 2 } })).status).toBe(404);
  });

  it("leaves a non-primary service out of urls, at once", async () => {
    const r = await call(api, "PATCH", `/apps/${APP}/primary-services`, { credential: acme, body: { primary: { web: false } } });
    expect(r.status).toBe(200);
    expect(r.body.urls).toEqual([]);
    expect(r.body.services[0].url).toEqual(expect.any(String));
    const back = await call(api, "PATCH", `/apps/${APP}/primary-services`, { credential: acme, body: { primary: { web: true } } });
    expect(back.body.urls).toEqual([back.body.services[0].url]);
    expect((await call(api, "PATCH", `/apps/${APP}/primary-services`, { credential: acme, body: { primary: { nope: true } } })).status).toBe(404);
  });

  it("re-asserts the route when visibility flips", async () => {
    const url = (await getApp()).urls[0] as string;
    const patched = await call(api, "PATCH", `/apps/${APP}`, { credential: acme, body: { visibility: "private" } });
    expect(patched.status).toBe(200);
    // PATCH answers the single-app response, the latest deploy's and build's outcomes included.
    const read = await getApp();
    expect(patched.body.last_build_status).toEqual(expect.any(String));
    expect(patched.body.last_deploy_status).toEqual(expect.any(String));
    expect(patched.body.last_build_status).toBe(read.last_build_status);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(404);
    expect((await getApp()).urls).toEqual([]);
    expect((await call(api, "PATCH", `/apps/${APP}`, { credential: acme, body: { visibility: "public" } })).status).toBe(200);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
    const queue = await call(api, "GET", `/deployments/queue?app_name=${APP}&all=true`, { credential: acme });
    expect(queue.body.filter((a: any) => a.action_type === "RECONCILE_ROUTING").length).toBeGreaterThanOrEqual(2);
    // Asked for by hand, a reconcile is an action, not a deployment.
    const reconcile = await call(api, "POST", `/apps/${APP}/reconcile`, { credential: acme });
    expect(reconcile).toMatchObject({ status: 202, body: { action_id: expect.any(String), deployment_id: null } });
  });

  it("applies a flip to private asked for during a deploy's health check at once, and keeps it past the deploy's swap", async () => {
    const url = (await getApp()).urls[0] as string;
    // It answers its health check only after a while: the flip comes while the deploy waits for it.
    const deployId = await deployWaitingForHealth("slow start", 9000);
    expect((await call(api, "PATCH", `/apps/${APP}`, { credential: acme, body: { visibility: "private" } })).status).toBe(200);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(404);
    // The running release lost its public route before the new one passed its checks.
    expect((await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body.status).not.toBe("completed");
    await waitFor(async () => (await call(api, "GET", `/deployments/${deployId}`, { credential: acme })).body.status, (s) => s === "completed", 90_000);
    expect((await viaRouter(`${url}/`)).status).toBe(404);
    expect((await getApp()).urls).toEqual([]);
    await web.commit("quick start again", { "server.js": serverJs });
    const again = await buildAndDeploy();
    expect(again.deploy.status, again.deploy.error_message).toBe("completed");
    expect((await viaRouter(`${url}/`)).status).toBe(404);
    expect((await call(api, "PATCH", `/apps/${APP}`, { credential: acme, body: { visibility: "public" } })).status).toBe(200);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
  });
});

describe("a renamed group", () => {
  it("keeps its running app: still served and running, its new log lines and later actions under the new slug", async () => {
    const url = (await getApp()).urls[0] as string;
    const restarts = async () => (await call(api, "GET", `/logs?app_name=${APP}&source=agent&search=restarted`, { credential: acme })).body.logs.length as number;
    const before = await restarts();
    expect((await call(api, "PATCH", "/groups/acme", { credential: fleet.rootKey, body: { slug: "acme-renamed" } })).status).toBe(200);
    await expect.poll(async () => (await getApp()).group_slug, { timeout: 10_000 }).toBe("acme-renamed");
    expect((await viaRouter(`${url}/`)).status).toBe(200);
    // The agent relabels what it runs and says so in a heartbeat at once, not 30 s later.
    await expect.poll(async () => (await call(api, "GET", `/services/${APP}`, { credential: acme })).body.services?.[0]?.status, { timeout: 10_000 }).toBe("running");
    await expect.poll(restarts, { timeout: 10_000 }).toBe(before);
    // A line the running replica's supervisor writes after the rename is the renamed group's.
    expect((await viaRouter(`${url}/crash`)).body).toBe("exiting\n");
    await expect.poll(restarts, { timeout: 30_000 }).toBe(before + 1);
    await expect.poll(async () => (await viaRouter(`${url}/`)).status, { timeout: 30_000 }).toBe(200);
  });
});

describe("undeploy", () => {
  it("takes the route away and clears the running fields", async () => {
    const url = (await getApp()).urls[0] as string;
    // Asked twice at once: one undeploy is queued, and both answers name it.
    const undeploy = () => call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: {} });
    const [r, again] = await Promise.all([undeploy(), undeploy()]);
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ app_name: APP, branch: "main", status: "queued", purge: false });
    expect(again).toMatchObject({ status: 202, body: { action_id: r.body.action_id, purge: false } });
    const queue = (await call(api, "GET", `/deployments/queue?app_name=${APP}&all=true&limit=500`, { credential: acme })).body as Array<{ action_id: string; action_type: string; created_at: string }>;
    const since = queue.find((a) => a.action_id === r.body.action_id)!.created_at;
    expect(queue.filter((a) => a.action_type === "UNDEPLOY" && a.created_at >= since).map((a) => a.action_id)).toEqual([r.body.action_id]);
    await waitFor(async () => (await getApp()).deploy_status, (s) => s === "undeployed", 60_000);
    expect(await getApp()).toMatchObject({ running_version: null, running_since: null, running_build_id: null, deploy_warning: null, urls: [], services: [{ name: "web", url: null }] });
    expect((await viaRouter(`${url}/`)).status).toBe(404);
    // What the app declares is said before that nothing runs: an undeclared service is 404.
    expect((await call(api, "POST", `/services/${APP}/nope/stop`, { credential: acme })).status).toBe(404);
    expect(await call(api, "POST", `/services/${APP}/web/stop`, { credential: acme })).toMatchObject({ status: 409, body: { detail: { code: "nothing_running" } } });
  });

  it("cancels a deploy waiting for its build once an undeploy asked for after it has started: the build does not bring the app back", async () => {
    await withSlowBuild(3, async () => {
      const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
      expect(b.status).toBe(202);
      expect((await call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: {} })).status).toBe(202);
      const deploy = await waitFor(
        async () => (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.items.find((d: any) => d.image_tag === b.body.tag),
        (d) => ["completed", "failed", "cancelled"].includes(d?.status),
        60_000,
      );
      expect(deploy).toMatchObject({ status: "cancelled", error_message: expect.stringMatching(/^Superseded: the undeploy .* requested after this one has already started\.$/) });
      expect((await call(api, "GET", `/builds/id/${b.body.build_id}`, { credential: acme })).body.status).toBe("completed");
      expect(await getApp()).toMatchObject({ deploy_status: "undeployed", running_version: null, urls: [] });
    });
  });

  it("with purge also deletes the branch's images and builds", async () => {
    expect((await call(api, "GET", `/builds?app_name=${APP}`, { credential: acme })).body.total).toBeGreaterThan(0);
    const r = await call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: { branch: "main", purge: true } });
    expect(r.body).toMatchObject({ branch: "main", purge: true });
    await expect.poll(async () => (await call(api, "GET", `/builds?app_name=${APP}`, { credential: acme })).body.total, { timeout: 30_000 }).toBe(0);
    expect(await getApp()).toMatchObject({ deploy_status: "undeployed", latest_build: null });
    expect((await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP } })).status).toBe(400);
  });

  it("with purge cancels a build of the branch in flight and waits for it to end: no build outlives the purge", async () => {
    await withSlowBuild(4, async () => {
      const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: false } });
      expect(b.status).toBe(202);
      await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${b.body.action_id}`, { credential: acme })).body.phase, { timeout: 60_000 }).toBe("build:web");
      const r = await call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: { branch: "main", purge: true } });
      expect(r.status).toBe(202);
      const undeploy = await waitFor(async () => (await call(api, "GET", `/deployments/queue/${r.body.action_id}`, { credential: acme })).body, (a) => a.status === "completed", 60_000);
      const build = (await call(api, "GET", `/deployments/queue/${b.body.action_id}`, { credential: acme })).body;
      expect(build).toMatchObject({ status: "cancelled" });
      expect(Date.parse(undeploy.completed_at)).toBeGreaterThanOrEqual(Date.parse(build.completed_at));
      await expect.poll(async () => (await call(api, "GET", `/builds?app_name=${APP}`, { credential: acme })).body.total, { timeout: 30_000 }).toBe(0);
      expect((await call(api, "GET", `/builds/id/${b.body.build_id}`, { credential: acme })).status).toBe(404);
      expect(await getApp()).toMatchObject({ latest_build: null });
    });
  });
});

describe("queue a deployment", () => {
  it("deploys branch main when the body names none, not the production branch", async () => {
    const staging = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "staging-only", repository: "https://github.com/acme/staging-only.git", branch: "staging" } });
    expect(staging.status).toBe(201);
    expect(staging.body.is_production).toBe(true);
    const noMain = await call(api, "POST", "/deployments?skip_preflight=true", { credential: acme, body: { app_name: "staging-only" } });
    expect(noMain.status).toBe(404);
    // Named, the branch is found; it has no successful build to deploy.
    expect((await call(api, "POST", "/deployments?skip_preflight=true", { credential: acme, body: { app_name: "staging-only", branch: "staging" } })).status).toBe(400);
  });
});

describe("another group's ids are not found", () => {
  it("answers 404 (or not_found) on every id route of deployments and services", async () => {
    const id = (await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.items[0].id as string;
    expect((await call(api, "GET", `/deployments/${id}`, { credential: globex })).status).toBe(404);
    expect((await call(api, "GET", `/deployments/${id}/logs`, { credential: globex })).status).toBe(404);
    expect((await call(api, "POST", `/deployments/${id}/cancel`, { credential: globex })).body.status).toBe("not_found");
    expect((await call(api, "GET", `/deployments/history?app_name=${APP}`, { credential: globex })).body).toEqual({ items: [], total: 0 });
    expect((await call(api, "POST", "/deployments", { credential: globex, body: { app_name: APP } })).status).toBe(404);
    expect((await call(api, "PATCH", `/apps/${APP}/services/web/replicas`, { credential: globex, body: { replicas: 2 } })).status).toBe(404);
    expect((await call(api, "PATCH", `/apps/${APP}/primary-services`, { credential: globex, body: { primary: { web: true } } })).status).toBe(404);
    for (const path of [`/deployments/${APP}/undeploy`, `/apps/${APP}/redeploy`, `/apps/${APP}/retry`, `/apps/${APP}/reconcile`, `/services/${APP}/restart`, `/services/${APP}/web/stop`]) {
      expect((await call(api, "POST", path, { credential: globex, body: {} })).status, path).toBe(404);
    }
    expect((await call(api, "GET", `/services/${APP}`, { credential: globex })).status).toBe(404);
    expect((await call(api, "GET", "/deployments/short/logs", { credential: acme })).status).toBe(422);
    expect((await call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: { branch: "" } })).status).toBe(422);
    // A deployment's action is no build: its build log is not found, not made up from the queue.
    expect((await call(api, "GET", `/builds/id/${id}/logs`, { credential: acme })).status).toBe(404);
  });
});

describe("tenant code", () => {
  it("runs as the tenant user, and reaches none of the platform's own services on the host but the router and its own port", async () => {
    const reach = `
  if (path === "/reach") {
    // Connects to each host:port the query names ($PORT: its own) and says how each attempt ended.
    const targets = Object.entries(Object.fromEntries(new URL(req.url, "http://app").searchParams));
    import("node:net").then(({ default: net }) => Promise.all(targets.map(([name, to]) => new Promise((resolve) => {
      const at = to.lastIndexOf(":");
      const port = to.slice(at + 1) === "$PORT" ? process.env.PORT : to.slice(at + 1);
      const s = net.connect({ host: to.slice(0, at), port: Number(port), timeout: 3000 }, () => { s.destroy(); resolve([name, "connected"]); });
      s.on("timeout", () => { s.destroy(); resolve([name, "timeout"]); });
      s.on("error", (e) => resolve([name, e.code]));
    })))).then((seen) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ uid: process.getuid(), ...Object.fromEntries(seen) }));
    });
    return;
  }
  if (path === "/crash") {`;
    await web.commit("reach", { "server.js": serverJs.replace('  if (path === "/crash") {', reach) });
    const deployed = await buildAndDeploy();
    expect(deployed.deploy.status, deployed.deploy.error_message).toBe("completed");
    const hostPort = (url: string) => `${new URL(url).hostname}:${new URL(url).port}`;
    const targets = {
      postgres: hostPort(fleet.databaseUrl.replace(/^postgres(ql)?:/, "http:")),
      nats: hostPort(fleet.natsUrl.replace(/^nats:/, "http:")),
      deployQueue: hostPort(fleet.env.DEPLOY_QUEUE_URL!),
      api: hostPort(fleet.api),
      router: `127.0.0.1:${fleet.routerPort}`,
      self: "127.0.0.1:$PORT",
    };
    const url = (await waitFor(getApp, (a) => a.running_version === deployed.tag)).urls[0] as string;
    const res = await viaRouter(`${url}/reach?${new URLSearchParams(targets)}`);
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body)).toEqual({ uid: 61000, postgres: "ECONNREFUSED", nats: "ECONNREFUSED", deployQueue: "ECONNREFUSED", api: "ECONNREFUSED", router: "connected", self: "connected" });
  });
});

describe("a crash-looping service", () => {
  it("is among the app's warnings while its release serves, and no longer once a release that stays up replaces it", async () => {
    // Passes its health check, then dies every 3 s: the agent restarts it after 1, 2, then 4 s.
    await web.commit("dies after 3 s", { "server.js": `${serverJs}\nsetTimeout(() => process.exit(7), 3000);\n` });
    try {
      const looping = await buildAndDeploy();
      expect(looping.deploy.status, looping.deploy.error_message).toBe("completed");
      const app = await waitFor(getApp, (a) => a.warnings.some((w: string) => w.startsWith("Service web keeps crashing")), 60_000);
      expect(app).toMatchObject({ deploy_status: "running", running_version: looping.tag });
      expect(app.warnings.find((w: string) => w.startsWith("Service web"))).toMatch(
        /^Service web keeps crashing: 1 replica\(s\) crash-looping since \S+ \(3 crashes in a row without a minute's run; the last of them: exited with code 7\)\. /,
      );
    } finally {
      await web.commit("stays up", { "server.js": serverJs });
    }
    const steady = await buildAndDeploy();
    expect(steady.deploy.status, steady.deploy.error_message).toBe("completed");
    expect((await waitFor(getApp, (a) => a.running_version === steady.tag)).warnings).toEqual([]);
  });
});

describe("a deleted branch", () => {
  it("is refused while a deploy of it is queued, and takes its deployments, history and queue actions with it: registered again, the app starts with none of them", async () => {
    expect((await call(api, "GET", `/deployments/history?app_name=${APP}`, { credential: acme })).body.total).toBeGreaterThan(0);
    expect((await call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: {} })).status).toBe(202);
    await waitFor(async () => (await getApp()).deploy_status, (s) => s === "undeployed", 60_000);
    // A deploy accepted just before is not yet the app's state: the queue holds the deletion back.
    const deploy = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: APP } });
    expect(deploy.status).toBe(202);
    const refused = await call(api, "DELETE", `/apps/${APP}`, { credential: acme });
    expect(refused).toMatchObject({ status: 409, body: { detail: { code: "action_in_flight", action_id: deploy.body.action_id, action_type: "DEPLOY" } } });
    const deployed = await waitFor(async () => (await call(api, "GET", `/deployments/${deploy.body.action_id}`, { credential: acme })).body, (d) => ["completed", "failed", "cancelled"].includes(d.status), 120_000);
    expect(deployed.status).toBe("completed");
    expect((await call(api, "POST", `/deployments/${APP}/undeploy`, { credential: acme, body: {} })).status).toBe(202);
    await waitFor(async () => (await getApp()).deploy_status, (s) => s === "undeployed", 60_000);
    await expect.poll(async () => (await call(api, "DELETE", `/apps/${APP}`, { credential: acme })).status, { timeout: 30_000 }).toBe(204);
    const again = await call(api, "POST", "/apps", { credential: acme, body: { app_name: APP, repository: web.url } });
    expect(again.status).toBe(201);
    expect(again.body.app_name).toBe(APP);
    await expect.poll(async () => (await call(api, "GET", `/deployments/history?app_name=${APP}`, { credential: acme })).body.total, { timeout: 30_000 }).toBe(0);
    expect((await call(api, "GET", `/deployments?app_name=${APP}`, { credential: acme })).body.total).toBe(0);
    const queue = (await call(api, "GET", `/deployments/queue?app_name=${APP}&all=true`, { credential: acme })).body;
    // Only the new registration's own preflight.
    expect(queue.map((a: any) => a.action_type)).toEqual(["GIT_PREFLIGHT"]);
  });
});
