/**
 * What an app reports about where it serves and what serves (spec doc 1 sections 2.1 and 3.4):
 *
 * - front doors (`urls`, `services[].url`), rebuilt from the routing shape on every read: pure
 *   functions over the app row;
 * - deploy state (deploy_status, running_* rules 1-5, deploy_warning, last_deploy_*,
 *   last_crash_output) as the queue's action_updated events move it: applyDeployUpdate against a
 *   real Postgres, since it reads and writes the apps and builds rows.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { serviceSchema } from "@platform/config";
import { openDatabase, type EntityManager, type MikroORM } from "@platform/db";
import { createTestDatabase, dropDatabase } from "@platform/testing";
import { appsBuildsMigrations } from "../src/migrations/index.ts";
import { App, Build, entities } from "../src/entities/index.ts";
import { variableEntities } from "../src/entities/variables.ts";
import { applyDeployUpdate, type DeployActionUpdate } from "../src/domain/deploy-state.ts";
import { appUrls, frontDoorHost, isServing, publicHosts, serviceUrls, type RouterSettings } from "../src/domain/front-door.ts";
import { completedBuild } from "./rows.ts";

/** The app's urls as a read computes them: from its service URLs. */
const urlsOf = (app: Parameters<typeof serviceUrls>[0], router: Parameters<typeof serviceUrls>[1]) => appUrls(app, serviceUrls(app, router));

// ---------------------------------------------------------------------------------------------
// Front doors

const router: RouterSettings = { environment: "staging", domain: "example.test", port: 80 };

/** A container app with a web service at `/`, an api at `/api`, a mount-less http service and a worker. */
function routedConfig(): Record<string, unknown> {
  return {
    type: "container",
    services: {
      web: { run: "node web.js", port: 8080, mount: "/" },
      api: { run: "node api.js", port: 8081, mount: "/api" },
      admin: { run: "node admin.js", port: 8082 },
      worker: { run: "node worker.js", background: true },
    },
  };
}

type AddressedApp = Parameters<typeof serviceUrls>[0];

function addressed(overrides: Partial<AddressedApp> = {}): AddressedApp {
  return {
    appName: "shop",
    branchLabel: "feature-x",
    isProduction: true,
    visibility: "public",
    baseConfig: routedConfig(),
    overlay: {},
    deployStatus: "running",
    runningVersion: "main-1",
    runningMounts: null,
    serviceNames: [],
    primaryOverrides: {},
    ...overrides,
  };
}

describe("front door host (doc 1 section 2.1)", () => {
  it("is <app>.<env>.<domain> for the production branch", () => {
    expect(frontDoorHost(addressed(), router)).toBe("shop.staging.example.test");
  });

  it("is <app>-<branchLabel>.<env>.<domain> for another branch", () => {
    expect(frontDoorHost(addressed({ isProduction: false }), router)).toBe("shop-feature-x.staging.example.test");
  });

  it("a private app has no public host", () => {
    expect(publicHosts(addressed({ visibility: "private" }), router)).toEqual([]);
    expect(publicHosts(addressed(), router)).toEqual(["shop.staging.example.test"]);
  });
});

describe("services[].url and urls (doc 1 section 2.1: rebuilt from the routing shape on every read)", () => {
  it("a service mounted at / is the bare front door, a path-mounted one adds its mount, unrouted ones have none", () => {
    // A release reported without mounts runs what the config declares.
    expect(serviceUrls(addressed(), router)).toEqual([
      { name: "web", url: "http://shop.staging.example.test", inServingRelease: true },
      { name: "api", url: "http://shop.staging.example.test/api", inServingRelease: true },
      // An HTTP service without a mount is not routed on the front door.
      { name: "admin", url: null, inServingRelease: true },
      // A background service has no port and no mount.
      { name: "worker", url: null, inServingRelease: true },
    ]);
    expect(urlsOf(addressed(), router)).toEqual(["http://shop.staging.example.test", "http://shop.staging.example.test/api"]);
  });

  it("lists services as the config declares them, though the stored config keeps its keys in jsonb's order, and the root URL first", () => {
    const config = routedConfig() as { services: Record<string, unknown> };
    // jsonb orders keys by length, then bytes: api, web, admin, worker.
    const stored = { ...config, services: Object.fromEntries(["api", "web", "admin", "worker"].map((n) => [n, config.services[n]])) };
    const app = addressed({ baseConfig: stored, serviceNames: ["web", "api", "admin", "worker"] });
    expect(serviceUrls(app, router).map((s) => s.name)).toEqual(["web", "api", "admin", "worker"]);
    expect(urlsOf(app, router)).toEqual(["http://shop.staging.example.test", "http://shop.staging.example.test/api"]);
    // Declared after the path-mounted one, the root service's URL still comes first.
    expect(urlsOf(addressed({ baseConfig: stored, serviceNames: ["api", "web", "admin", "worker"] }), router)[0]).toBe("http://shop.staging.example.test");
  });

  it("leaves port 80 out of URLs and writes any other router port", () => {
    expect(urlsOf(addressed(), { ...router, port: 8443 })).toEqual(["http://shop.staging.example.test:8443", "http://shop.staging.example.test:8443/api"]);
  });

  it("uses the branch host for a non-production branch", () => {
    expect(urlsOf(addressed({ isProduction: false }), router)[0]).toBe("http://shop-feature-x.staging.example.test");
  });

  it("a private app has no urls and no service urls", () => {
    const app = addressed({ visibility: "private" });
    expect(urlsOf(app, router)).toEqual([]);
    expect(serviceUrls(app, router).every((s) => s.url === null)).toBe(true);
  });

  it("nothing has a URL while nothing serves: undeployed, undeploying, or no running version", () => {
    for (const app of [
      addressed({ deployStatus: "undeployed", runningVersion: null }),
      addressed({ deployStatus: "undeploying" }),
      // Never deployed: a first deploy in flight serves nothing yet.
      addressed({ deployStatus: "deploying", runningVersion: null }),
    ]) {
      expect(isServing(app)).toBe(false);
      expect(urlsOf(app, router)).toEqual([]);
      expect(serviceUrls(app, router).map((s) => s.url)).toEqual([null, null, null, null]);
    }
  });

  it("a failed deploy with an older version still serving keeps its front doors (rule 4)", () => {
    expect(urlsOf(addressed({ deployStatus: "failed", runningVersion: "main-1" }), router)).toHaveLength(2);
  });

  it("a service whose primary override is false is left out of urls but keeps its services[].url", () => {
    const app = addressed({ primaryOverrides: { api: false } });
    expect(urlsOf(app, router)).toEqual(["http://shop.staging.example.test"]);
    expect(serviceUrls(app, router).find((s) => s.name === "api")?.url).toBe("http://shop.staging.example.test/api");
  });

  it("without a routing shape reported by the agent, follows the effective config (a mount changed from the dashboard)", () => {
    const app = addressed({ overlay: { "services.api.mount": { value: "/v2", base: "/api" } } });
    expect(serviceUrls(app, router).find((s) => s.name === "api")?.url).toBe("http://shop.staging.example.test/v2");
  });

  it("with the serving release's routing shape, shows what is routed now, not what the next deploy will route", () => {
    const app = addressed({
      // The dashboard re-mounted api and added a service since the release was deployed.
      overlay: {
        "services.api.mount": { value: "/v2", base: "/api" },
        "services.docs": { value: { run: "node docs.js", port: 8083, mount: "/docs" }, base: null },
      },
      // The release still runs an old service the config no longer has.
      runningMounts: { web: "/", api: "/api", admin: null, worker: null, legacy: "/old" },
    });
    expect(serviceUrls(app, router)).toEqual([
      { name: "web", url: "http://shop.staging.example.test", inServingRelease: true },
      { name: "api", url: "http://shop.staging.example.test/api", inServingRelease: true },
      { name: "admin", url: null, inServingRelease: true },
      { name: "worker", url: null, inServingRelease: true },
      // Saved with save-config: the next deploy runs it, the serving release does not.
      { name: "docs", url: null, inServingRelease: false },
      { name: "legacy", url: "http://shop.staging.example.test/old", inServingRelease: true },
    ]);
    const undeployed = serviceUrls({ ...app, deployStatus: "undeployed" }, router);
    expect(undeployed.every((s) => s.url === null && !s.inServingRelease)).toBe(true);
  });

  it("without a config yet, lists the known service names with no URL", () => {
    expect(serviceUrls(addressed({ baseConfig: null, serviceNames: ["web"] }), router)).toEqual([{ name: "web", url: null, inServingRelease: true }]);
  });
});

// ---------------------------------------------------------------------------------------------
// Deploy state

let databaseUrl: string;
let orm: MikroORM;

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  orm = await openDatabase({
    url: databaseUrl,
    schema: serviceSchema("apps-builds"),
    entities: [...entities, ...variableEntities],
    migrations: appsBuildsMigrations,
    poolMax: 3,
  });
});

afterAll(async () => {
  await orm?.close(true);
  if (databaseUrl) await dropDatabase(databaseUrl);
});

const write = <T>(fn: (em: EntityManager) => Promise<T>) => orm.em.fork().transactional(fn);
const reload = (id: string) => orm.em.fork().findOneOrFail(App, { id });

let counter = 0;
/** Registers an app branch with the given deploy state and returns it. */
async function registerApp(fields: Partial<App> = {}): Promise<App> {
  counter += 1;
  const appName = `shop${counter}`;
  return write(async (em) =>
    em.create(App, {
      id: randomUUID(),
      appName,
      baseName: appName,
      displayName: appName,
      slug: appName,
      groupSlug: "acme",
      branch: "main",
      branchLabel: "main",
      repository: "https://git.example.test/acme/shop.git",
      repositoryKey: `git.example.test/acme/shop${counter}`,
      configPath: "platform.yaml",
      description: "",
      deployStatus: "undeployed",
      visibility: "public",
      isProduction: true,
      latestBuild: null,
      buildCount: 0,
      databaseEnabled: false,
      cacheEnabled: false,
      emailEnabled: false,
      preflightStatus: "ready",
      preflightResult: null,
      preflightNonce: 0,
      serviceNames: ["web"],
      warnings: [],
      deployWarning: null,
      primaryOverrides: {},
      baseConfig: null,
      overlay: {},
      seedFromReference: null,
      cloneData: null,
      createdBy: "api_key:k",
      ...fields,
    }),
  );
}

async function addBuild(app: App, tag: string, config: Record<string, unknown> | null = null): Promise<string> {
  return write(async (em) => completedBuild(em, app, tag, config));
}

/** An action_updated event for `app`, applied in a transaction; returns the app row as stored. */
async function apply(app: App, u: Partial<DeployActionUpdate> & Pick<DeployActionUpdate, "action_type" | "status">): Promise<App> {
  // Claimed unless said otherwise: the updates of an action an agent ran.
  const update: DeployActionUpdate = { action_id: randomUUID(), app_name: app.appName, branch: app.branch, group_slug: app.groupSlug, claimed_at: new Date().toISOString(), ...u };
  const applied = await write((em) => applyDeployUpdate(em, update));
  expect(applied?.id).toBe(app.id);
  return reload(app.id);
}

describe("deploy state from DEPLOY and RETRY actions (doc 1 sections 2.1 and 3.4)", () => {
  it("a claimed DEPLOY makes the app deploying and records it as the latest deploy", async () => {
    const app = await registerApp();
    const actionId = randomUUID();
    const after = await apply(app, { action_id: actionId, action_type: "DEPLOY", status: "in_progress", image_tag: "main-1" });
    expect(after).toMatchObject({ deployStatus: "deploying", lastDeployActionId: actionId, lastDeployStatus: "in_progress", runningVersion: null });
  });

  it("leaves alone a branch registered again after the action was queued: it was an earlier registration's", async () => {
    const app = await registerApp();
    const queuedBefore = new Date(app.createdAt.getTime() - 1_000).toISOString();
    const after = await apply(app, { action_type: "DEPLOY", status: "failed", error_message: "The agent failed: [not_found] App has no branch 'main'", created_at: queuedBefore });
    expect(after).toMatchObject({ deployStatus: "undeployed", lastDeployActionId: null, lastDeployStatus: null, lastDeployError: null });
    const ours = await apply(app, { action_type: "DEPLOY", status: "in_progress", image_tag: "main-1", created_at: new Date().toISOString() });
    expect(ours).toMatchObject({ deployStatus: "deploying", lastDeployStatus: "in_progress" });
  });

  it("a completed DEPLOY makes it running with the release's tag, completion time and build id", async () => {
    const app = await registerApp();
    const buildId = randomUUID();
    const after = await apply(app, {
      action_type: "DEPLOY",
      status: "completed",
      image_tag: "main-1",
      build_id: buildId,
      completed_at: "2026-11-20T12:00:00.000Z",
    });
    expect(after).toMatchObject({ deployStatus: "running", runningVersion: "main-1", runningBuildId: buildId, lastDeployStatus: "completed", lastDeployError: null });
    expect(after.runningSince?.toISOString()).toBe("2026-11-20T12:00:00.000Z");
    // The branch's first deploy: the one a seed reference is consumed by. Later ones keep its time.
    expect(after.firstDeployedAt?.toISOString()).toBe("2026-11-20T12:00:00.000Z");
    const later = await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-2", completed_at: "2026-11-21T12:00:00.000Z" });
    expect(later.firstDeployedAt?.toISOString()).toBe("2026-11-20T12:00:00.000Z");
  });

  it("names the new release as serving from its swap commit, while the old colour drains; completed, it keeps that time", async () => {
    const app = await registerApp();
    await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-1", completed_at: "2026-11-20T12:00:00.000Z" });
    const actionId = randomUUID();
    const buildId = randomUUID();
    const claimed = await apply(app, { action_id: actionId, action_type: "DEPLOY", status: "in_progress", image_tag: "main-2", build_id: buildId });
    expect(claimed).toMatchObject({ deployStatus: "deploying", runningVersion: "main-1" });
    const swapped = await apply(app, { action_id: actionId, action_type: "DEPLOY", status: "in_progress", image_tag: "main-2", build_id: buildId, swap_committed_at: "2026-11-21T12:00:00.000Z" });
    expect(swapped).toMatchObject({ deployStatus: "deploying", runningVersion: "main-2", runningBuildId: buildId });
    expect(swapped.runningSince?.toISOString()).toBe("2026-11-21T12:00:00.000Z");
    const done = await apply(app, {
      action_id: actionId,
      action_type: "DEPLOY",
      status: "completed",
      image_tag: "main-2",
      build_id: buildId,
      swap_committed_at: "2026-11-21T12:00:00.000Z",
      completed_at: "2026-11-21T12:00:09.000Z",
    });
    expect(done).toMatchObject({ deployStatus: "running", runningVersion: "main-2", runningBuildId: buildId });
    expect(done.runningSince?.toISOString()).toBe("2026-11-21T12:00:00.000Z");
  });

  it("keeps the routing shape a completed deploy reports, and drops it when the branch is undeployed", async () => {
    const app = await registerApp();
    const deployed = await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-1", result: { mounts: { web: "/", worker: null } } });
    expect(deployed.runningMounts).toEqual({ web: "/", worker: null });
    // An agent that reports no shape: the URLs fall back to the config.
    expect((await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-2" })).runningMounts).toBeNull();
    await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-3", result: { mounts: { web: "/" } } });
    expect((await apply(app, { action_type: "UNDEPLOY", status: "completed" })).runningMounts).toBeNull();
  });

  it("applies updates in the order deploy-queue wrote them, not the order they arrive in", async () => {
    const app = await registerApp();
    const deploy = randomUUID();
    const t = (s: number) => new Date(Date.UTC(2026, 10, 24, 12, 0, s)).toISOString();
    await apply(app, { action_id: deploy, action_type: "DEPLOY", status: "completed", image_tag: "main-2", updated_at: t(30) });
    // Its claim, written earlier, arrives late: the app stays running.
    const late = await apply(app, { action_id: deploy, action_type: "DEPLOY", status: "in_progress", image_tag: "main-2", updated_at: t(10) });
    expect(late).toMatchObject({ deployStatus: "running", runningVersion: "main-2", lastDeployStatus: "completed" });
    // So does an older deploy's failure: it does not become the latest deploy.
    const older = await apply(app, { action_id: randomUUID(), action_type: "DEPLOY", status: "failed", image_tag: "main-1", error_message: "boom", updated_at: t(20) });
    expect(older).toMatchObject({ deployStatus: "running", lastDeployActionId: deploy, lastDeployError: null, deployWarning: null });
    // A later update applies.
    const undeploy = randomUUID();
    expect(await apply(app, { action_id: undeploy, action_type: "UNDEPLOY", status: "in_progress", updated_at: t(40) })).toMatchObject({
      deployStatus: "undeploying",
      lastDeployActionId: undeploy,
    });
  });

  it("re-derives database, cache and email from the repository's config at every deploy (spec 2.1)", async () => {
    const app = await registerApp({
      databaseEnabled: false,
      cacheEnabled: true,
      emailEnabled: false,
      baseConfig: { services: { web: { run: "node server.js", port: 8080 } }, database: { enabled: true }, email: { enabled: true } },
    });
    const after = await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-1" });
    expect(after).toMatchObject({ databaseEnabled: true, cacheEnabled: false, emailEnabled: true });
    // A rollback ships an older build: its config decides, not the latest build's.
    await addBuild(app, "main-0", { services: { web: { run: "node server.js", port: 8080 } }, cache: { enabled: true } });
    expect(await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-0" })).toMatchObject({ databaseEnabled: false, cacheEnabled: true, emailEnabled: false });
    // Without a repository config yet, the flags stay as they are.
    const bare = await registerApp({ databaseEnabled: true });
    expect(await apply(bare, { action_type: "DEPLOY", status: "completed", image_tag: "main-1" })).toMatchObject({ databaseEnabled: true });
  });

  it("rule 5: a no-build DEPLOY has no running_build_id (null, never a guess)", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1", runningBuildId: randomUUID() });
    const after = await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-1", build_id: null });
    expect(after.runningBuildId).toBeNull();
  });

  it("rules 3 and 5: a successful RETRY reports the retried tag and no build id, even when the event carries one", async () => {
    const app = await registerApp({ deployStatus: "failed", runningVersion: "main-1", runningBuildId: randomUUID() });
    const after = await apply(app, { action_type: "RETRY", status: "completed", image_tag: "main-2", build_id: randomUUID(), completed_at: "2026-11-20T13:00:00.000Z" });
    expect(after).toMatchObject({ deployStatus: "running", runningVersion: "main-2", runningBuildId: null });
  });

  it("rule 4: a failed deploy over an older running version keeps running_* and warns naming both tags", async () => {
    const buildId = randomUUID();
    const since = new Date("2026-11-19T10:00:00.000Z");
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1", runningBuildId: buildId, runningSince: since });
    const lines = Array.from({ length: 40 }, (_, i) => `line ${i + 1}`);
    const after = await apply(app, {
      action_type: "DEPLOY",
      status: "failed",
      image_tag: "main-2",
      error_message: "health check /healthz timed out",
      result: { crash_output: { web: lines } },
    });
    expect(after).toMatchObject({
      deployStatus: "failed",
      runningVersion: "main-1",
      runningBuildId: buildId,
      lastDeployStatus: "failed",
      lastDeployError: "health check /healthz timed out",
    });
    expect(after.runningSince?.getTime()).toBe(since.getTime());
    expect(after.deployWarning).toContain("main-2");
    expect(after.deployWarning).toContain("main-1");
    // last_crash_output holds at most 30 lines per service: the last ones, where the crash is.
    expect(after.lastCrashOutput).toEqual({ web: lines.slice(10) });
  });

  it("a deploy that failed unclaimed (its build failed) changes nothing that runs: last_deploy_* and the warning tell of it", async () => {
    const fresh = await registerApp();
    const never = await apply(fresh, { action_type: "DEPLOY", status: "failed", image_tag: "main-1", claimed_at: null, error_message: "Dependency BUILD b1 failed." });
    expect(never).toMatchObject({ deployStatus: "undeployed", deployWarning: null, lastDeployStatus: "failed", lastDeployError: "Dependency BUILD b1 failed." });

    const serving = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    const after = await apply(serving, { action_type: "DEPLOY", status: "failed", image_tag: "main-2", claimed_at: null, error_message: "Dependency BUILD b2 failed." });
    expect(after).toMatchObject({
      deployStatus: "running",
      runningVersion: "main-1",
      deployWarning: "The deploy of main-2 failed (Dependency BUILD b2 failed.); main-1 still serves.",
      lastDeployStatus: "failed",
      lastDeployError: "Dependency BUILD b2 failed.",
    });
  });

  it("a failed first deploy (nothing running) has no deploy_warning; no crash output leaves last_crash_output null", async () => {
    const app = await registerApp();
    const after = await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-1", error_message: "image pull failed" });
    expect(after).toMatchObject({ deployStatus: "failed", runningVersion: null, deployWarning: null, lastCrashOutput: null, lastDeployError: "image pull failed" });
  });

  it("a failed redeploy of the running tag (a scale) warns too: the release already running still serves", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    const after = await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-1", error_message: "Service web exited during the health checks." });
    expect(after).toMatchObject({ deployStatus: "failed", runningVersion: "main-1" });
    expect(after.deployWarning).toMatch(/main-1 failed .*already running still serves/);
  });

  it("a newly queued deploy has no error yet: the previous deploy's error is not reported as its", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-2", error_message: "boom" });
    const after = await apply(app, { action_type: "DEPLOY", status: "queued", image_tag: "main-3" });
    expect(after).toMatchObject({ lastDeployStatus: "queued", lastDeployError: null });
  });

  it("a failed deploy without an error message still reports one", async () => {
    const app = await registerApp();
    const after = await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-1" });
    expect(after.lastDeployError).toBe("The deploy failed.");
  });

  it("a later successful deploy clears the failure: no warning, error or crash output", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-2", result: { crash_output: { web: ["boom"] } } });
    const after = await apply(app, { action_type: "DEPLOY", status: "completed", image_tag: "main-3" });
    expect(after).toMatchObject({ deployStatus: "running", runningVersion: "main-3", deployWarning: null, lastDeployError: null, lastCrashOutput: null });
  });

  it("crash output describes only a failed latest deploy: the next deploy's start clears it", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-2", result: { crash_output: { web: ["boom"] } } });
    expect((await apply(app, { action_type: "DEPLOY", status: "queued", image_tag: "main-3" })).lastCrashOutput).toBeNull();
  });

  it("a cancelled deploy goes back to running when something serves", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    await apply(app, { action_type: "DEPLOY", status: "in_progress", image_tag: "main-2" });
    const after = await apply(app, { action_type: "DEPLOY", status: "cancelled", image_tag: "main-2" });
    expect(after).toMatchObject({ deployStatus: "running", runningVersion: "main-1", lastDeployStatus: "cancelled" });
  });

  it("a cancelled first deploy goes back to undeployed", async () => {
    const app = await registerApp();
    await apply(app, { action_type: "DEPLOY", status: "in_progress", image_tag: "main-1" });
    const after = await apply(app, { action_type: "DEPLOY", status: "cancelled", image_tag: "main-1" });
    expect(after).toMatchObject({ deployStatus: "undeployed", runningVersion: null });
  });

  it("a deploy cancelled before any agent claimed it leaves the deploy status as it was", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-2", error_message: "health check failed" });
    const after = await apply(app, { action_type: "DEPLOY", status: "cancelled", image_tag: "main-3", claimed_at: null });
    expect(after).toMatchObject({ deployStatus: "failed", runningVersion: "main-1", lastDeployStatus: "cancelled", deployWarning: expect.stringContaining("main-2") });
  });

  it("ignores an update for an app branch it does not know", async () => {
    const missing = await write((em) =>
      applyDeployUpdate(em, { action_id: randomUUID(), action_type: "DEPLOY", status: "completed", app_name: "nope", branch: "main", group_slug: "acme" }),
    );
    expect(missing).toBeNull();
  });
});

describe("deploy state from UNDEPLOY actions (doc 1 sections 2.1 rule 4 and 4.5)", () => {
  it("an UNDEPLOY in flight makes the app undeploying", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1" });
    expect((await apply(app, { action_type: "UNDEPLOY", status: "in_progress" })).deployStatus).toBe("undeploying");
  });

  it("a completed UNDEPLOY makes it undeployed with every running_* field null and the warning suppressed", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1", runningBuildId: randomUUID(), runningSince: new Date() });
    await apply(app, { action_type: "DEPLOY", status: "failed", image_tag: "main-2" });
    expect((await reload(app.id)).deployWarning).not.toBeNull();
    const after = await apply(app, { action_type: "UNDEPLOY", status: "completed" });
    expect(after).toMatchObject({ deployStatus: "undeployed", runningVersion: null, runningSince: null, runningBuildId: null, deployWarning: null, lastCrashOutput: null });
  });

  it("a failed UNDEPLOY is undeploy_failed and still reports the tag", async () => {
    const buildId = randomUUID();
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1", runningBuildId: buildId });
    const after = await apply(app, { action_type: "UNDEPLOY", status: "failed", error_message: "router unreachable" });
    expect(after).toMatchObject({ deployStatus: "undeploy_failed", runningVersion: "main-1", runningBuildId: buildId, lastDeployError: "router unreachable" });
  });

  it("a completed UNDEPLOY without purge keeps the branch's builds", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-1", latestBuild: "main-1" });
    await addBuild(app, "main-1");
    const after = await apply(app, { action_type: "UNDEPLOY", status: "completed", result: { purge: false } });
    expect(after.latestBuild).toBe("main-1");
    expect(await orm.em.fork().count(Build, { appId: app.id })).toBe(1);
  });

  it("a completed UNDEPLOY with purge deletes the branch's builds (their images are gone) and clears latest_build", async () => {
    const app = await registerApp({ deployStatus: "running", runningVersion: "main-2", latestBuild: "main-2" });
    await addBuild(app, "main-1");
    await addBuild(app, "main-2");
    // Another branch of the same app keeps its builds.
    const other = await registerApp({ appName: app.appName, branch: "dev", branchLabel: "dev", isProduction: false });
    await addBuild(other, "dev-1");

    const after = await apply(app, { action_type: "UNDEPLOY", status: "completed", result: { purge: true } });
    expect(after).toMatchObject({ deployStatus: "undeployed", latestBuild: null, runningVersion: null });
    expect(await orm.em.fork().count(Build, { appId: app.id })).toBe(0);
    expect(await orm.em.fork().count(Build, { appId: other.id })).toBe(1);
  });
});
