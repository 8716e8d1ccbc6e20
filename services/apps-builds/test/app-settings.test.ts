/**
 * App settings against the real Postgres and NATS (spec doc 1 section 4.4): PATCH of an app
 * branch, set-production, and the config layers (GET and PUT config), through apps-builds'
 * Connect API; then the gateway's routes for them, over the same running service.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import Fastify, { type FastifyInstance } from "fastify";
import pg from "pg";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { appsBuildsEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { makeCaller, type Caller } from "@platform/caller";
import { connectBus, subjects, subscribe, type Bus, type EventEnvelope } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { parseAppConfigYaml } from "@platform/app-config";
import { createTestDatabase, deleteBusStreams, dropDatabase, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { startIdentity, type TestIdentity } from "./identity.ts";
import { completedBuild } from "./rows.ts";
import { App, Build } from "../src/entities/index.ts";
import { PATCH_FIELDS, SEED_REFERENCE_MAX, lockApp } from "../src/domain/app-settings.ts";
// The gateway's routes for these capabilities, mounted over this service in the last block.
import { appSettingsRoutes } from "../../../gateway/src/routes/app-settings.ts";
import { registerErrorHandling } from "../../../gateway/src/errors.ts";
import { sharedSchemas } from "../../../gateway/src/schemas.ts";

const logger = createLogger({ service: "apps-builds-test", level: "silent", pretty: false });
const REPOSITORY = "https://example.com/acme/web.git";

let databaseUrl: string;
let prefix: string;
let identity: TestIdentity;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof AppsBuildsService>>;
let bus: Bus;
const preflights: EventEnvelope[] = [];
const reconciles: EventEnvelope[] = [];

const acme: Caller = makeCaller({ kind: "api_key", principalId: "k-acme", scope: "deploy", visibleGroups: ["acme"], selectedGroup: "acme" });
const globex: Caller = makeCaller({ kind: "api_key", principalId: "k-globex", scope: "deploy", visibleGroups: ["globex"], selectedGroup: "globex" });


const json = (value: unknown) => fromJson(ValueSchema, value as JsonValue);

function patch(body: unknown, opts: { app?: string; branch?: string; caller?: Caller } = {}) {
  return client.updateApp({ caller: opts.caller ?? acme, appName: opts.app ?? "web", branch: opts.branch ?? "main", patch: json(body) });
}

function save(body: unknown, opts: { app?: string; branch?: string; caller?: Caller } = {}) {
  return client.saveAppConfig({ caller: opts.caller ?? acme, appName: opts.app ?? "web", branch: opts.branch ?? "main", body: json(body) });
}

function layers(opts: { app?: string; branch?: string; caller?: Caller } = {}) {
  return client.getAppConfig({ caller: opts.caller ?? acme, appName: opts.app ?? "web", branch: opts.branch ?? "main" });
}

function row(appName: string, branch: string): Promise<App> {
  return service.ctx.read((em) => em.findOneOrFail(App, { appName, branch }));
}

/** Writes a row's columns directly (what preflight, builds and deploys would have written). */
function setRow(appName: string, branch: string, changes: Partial<App>): Promise<void> {
  return service.ctx.write(async (em) => {
    const app = await em.findOneOrFail(App, { appName, branch });
    Object.assign(app, changes);
  });
}

async function waitFor<T>(find: () => T | undefined, timeoutMs = 10_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const found = find();
    if (found !== undefined) return found;
    if (Date.now() > until) throw new Error("timed out waiting");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The ARCHITECTURE section 6 example, as a repository base (a fresh copy each call). */
function repoConfig(): Record<string, any> {
  return {
    type: "container",
    services: {
      web: { build: "npm ci && npm run build", run: "node server.js", port: 8080, health: "/healthz", replicas: 1, memory_mb: 256, mount: "/" },
      worker: { run: "node worker.js", background: true },
    },
    database: { enabled: true },
    cache: { enabled: false },
    email: { enabled: true },
    storage: { drives: [{ name: "uploads", size_gb: 1, mount: "/data/uploads" }], buckets: [{ name: "media" }] },
    cron: [{ name: "nightly", schedule: "0 3 * * *", path: "/cron/nightly", enabled: true }],
  };
}

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  identity = await startIdentity({ databaseUrl, prefix, groups: ["acme", "globex"] });
  service = await build(
    loadConfig(appsBuildsEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent", IDENTITY_URL: identity.url }),
  );
  client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${service.rpc.port}`);
  bus = await connectBus({ url: testNatsUrl(), name: "apps-builds-test", prefix });
  subscribe(bus, subjects.events.preflightRequested, (e) => void preflights.push(e), logger);
  subscribe(bus, subjects.events.reconcileRequested, (e) => void reconciles.push(e), logger);

  await client.registerApp({ caller: acme, appName: "web", repository: REPOSITORY });
  await client.registerApp({ caller: acme, appName: "web", repository: REPOSITORY, branch: "staging" });
  await client.registerApp({ caller: acme, appName: "api", repository: "https://example.com/acme/api.git" });
  await client.registerApp({ caller: globex, appName: "shop", repository: "https://example.com/globex/shop.git" });
});

afterAll(async () => {
  await bus?.close();
  await service?.close();
  await identity?.service.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

describe("PATCH an app", () => {
  it("changes only the fields sent and answers the app", async () => {
    const before = await row("web", "main");
    const r = await patch({ display_name: "  Web Shop ", description: "The shop front.", cache_enabled: true, email_enabled: true });
    expect(r.app).toMatchObject({ appName: "web", branch: "main", displayName: "Web Shop", description: "The shop front.", cacheEnabled: true, emailEnabled: true });
    expect(r.preflightActionId).toBeUndefined();
    const after = await row("web", "main");
    expect(after).toMatchObject({ displayName: "Web Shop", description: "The shop front.", cacheEnabled: true, emailEnabled: true, databaseEnabled: false });
    expect(after.configPath).toBe(before.configPath);
    expect(after.preflightNonce).toBe(before.preflightNonce);
    // The answer is the app as the write left it, its updated_at included.
    expect(r.app?.updatedAt).toBe(after.updatedAt.toISOString());
    expect(after.updatedAt.getTime()).toBeGreaterThan(before.updatedAt.getTime());
    // The other branch is another row.
    expect((await row("web", "staging")).displayName).toBe("web");
  });

  it("answers 404 for an app deleted between being found and being locked (a DELETE racing the PATCH), not an internal error", async () => {
    await client.registerApp({ caller: acme, appName: "web", repository: REPOSITORY, branch: "raced" });
    const found = await row("web", "raced");
    await client.deleteApp({ caller: acme, appName: "web", branch: "raced" });
    expect(await refusal(service.ctx.write((em) => lockApp(em, found)))).toMatchObject({ status: 404, detail: "App 'web' has no branch 'raced'" });
  });

  it("accepts an empty body as a no-op", async () => {
    const before = await row("web", "main");
    const r = await patch({});
    expect(r.app?.displayName).toBe(before.displayName);
  });

  it("stores deploy_config, services and containers as sent, and derives omitted feature flags from deploy_config", async () => {
    await setRow("web", "main", { databaseEnabled: false, cacheEnabled: true, emailEnabled: true });
    const deployConfig = { database: { enabled: true }, cache: { enabled: false }, region: "eu", nested: { list: [1, "two", null] } };
    const services = [{ name: "web", port: 8080 }, "worker"];
    const containers = [{ image: "redis:7" }];
    const r = await patch({ deploy_config: deployConfig, services, containers, cache_enabled: true });
    // database derived from deploy_config; cache sent explicitly wins; email has no section: kept.
    expect(r.app).toMatchObject({ databaseEnabled: true, cacheEnabled: true, emailEnabled: true });
    const stored = await row("web", "main");
    expect(stored.deployConfig).toEqual(deployConfig);
    expect(stored.deployServices).toEqual(services);
    expect(stored.deployContainers).toEqual(containers);
  });

  it("re-queues the preflight for a new config_path, and not for the same one", async () => {
    await setRow("web", "main", { preflightStatus: "ready", baseConfig: repoConfig() });
    const before = await row("web", "main");
    const r = await patch({ config_path: "deploy/platform.yaml" });
    expect(r.app).toMatchObject({ configPath: "deploy/platform.yaml", preflightStatus: "pending" });
    expect(r.preflightActionId).toMatch(/^[0-9a-f-]{36}$/);
    const after = await row("web", "main");
    expect(after.preflightNonce).toBe(before.preflightNonce + 1);
    // The base layer was read from the old file: the preflight reads the new one.
    expect(after.baseConfig).toBeNull();
    const event = await waitFor(() => preflights.find((e) => e.data.action_id === r.preflightActionId));
    expect(event.data).toMatchObject({ app_id: before.id, nonce: after.preflightNonce, config_path: "deploy/platform.yaml", branch: "main", app_name: "web", requested_by: expect.any(String) });

    const again = await patch({ config_path: "deploy/platform.yaml" });
    expect(again.preflightActionId).toBeUndefined();
    expect((await row("web", "main")).preflightNonce).toBe(after.preflightNonce);
    await patch({ config_path: "platform.yaml" });
  });

  it("refuses a config_path another app of the group builds the same repository from (409 repository_already_registered)", async () => {
    await client.registerApp({ caller: acme, appName: "mono-a", repository: "https://example.com/acme/mono.git", configPath: "a/platform.yaml" });
    await client.registerApp({ caller: acme, appName: "mono-b", repository: "https://example.com/acme/mono.git", configPath: "b/platform.yaml" });
    expect(await refusal(patch({ config_path: "a/platform.yaml" }, { app: "mono-b" }))).toMatchObject({ status: 409, detail: { code: "repository_already_registered", app_name: "mono-a" } });
    expect((await row("mono-b", "main")).configPath).toBe("b/platform.yaml");
    // Another group may build it so, as it may register it.
    await client.registerApp({ caller: globex, appName: "mono-c", repository: "https://example.com/acme/mono.git", configPath: "c/platform.yaml" });
    expect((await patch({ config_path: "a/platform.yaml" }, { app: "mono-c", caller: globex })).app?.configPath).toBe("a/platform.yaml");
  });

  it("refuses a config_path that is not a relative path inside the repository", async () => {
    for (const configPath of ["/etc/platform.yaml", "../platform.yaml", "a//platform.yaml", "", "   ", "deploy/"]) {
      const r = await refusal(patch({ config_path: configPath }));
      expect(r.status, configPath).toBe(422);
      expect(r.detail).toMatchObject({ code: "invalid_value", errors: [{ field: "config_path", code: "invalid_value" }] });
    }
    expect((await row("web", "main")).configPath).toBe("platform.yaml");
  });

  it("stores a visibility change; while deployed, it queues a route reconcile through the outbox", async () => {
    const quiet = await patch({ visibility: "private" });
    expect(quiet.app).toMatchObject({ visibility: "private", warnings: [] });

    await setRow("web", "main", { deployStatus: "running", warnings: ["an unrelated warning"] });
    const before = reconciles.length;
    const flipped = await patch({ visibility: "public" });
    expect(flipped.app).toMatchObject({ visibility: "public", warnings: ["an unrelated warning"] });
    await expect.poll(() => reconciles.length, { timeout: 10_000 }).toBe(before + 1);
    expect(reconciles.at(-1)?.data).toMatchObject({ app_name: "web", branch: "main", group_slug: "acme" });
    // Sending the current value changes nothing and queues nothing.
    await patch({ visibility: "public" });
    await new Promise((r) => setTimeout(r, 300));
    expect(reconciles.length).toBe(before + 1);

    expect(await refusal(patch({ visibility: "secret" }))).toMatchObject({ status: 422, detail: { code: "invalid_value" } });
    await setRow("web", "main", { deployStatus: "undeployed", warnings: [], visibility: "public" });
  });

  it("honours force_remove_domains on the production branch only (no custom domain can be attached yet)", async () => {
    expect((await patch({ force_remove_domains: true })).app?.appName).toBe("web");
    expect(await refusal(patch({ visibility: "private", force_remove_domains: true }, { branch: "staging" }))).toMatchObject({
      status: 409,
      detail: { code: "force_on_non_owning_branch", branch: "staging" },
    });
    expect((await row("web", "staging")).visibility).toBe("public");
    expect((await patch({ force_remove_domains: false }, { branch: "staging" })).app?.branch).toBe("staging");
    expect(await refusal(patch({ force_remove_domains: "yes" }))).toMatchObject({ status: 422, detail: { code: "wrong_type" } });
  });

  describe("seed_from_reference", () => {
    it("accepts a branch of this app or of an app in the same group, and null clears it", async () => {
      await patch({ seed_from_reference: "web:staging:latest" });
      expect((await row("web", "main")).seedFromReference).toBe("web:staging:latest");
      // The selector may itself hold colons (a timestamp).
      await patch({ seed_from_reference: "api:main:2024-05-01T03:00:00Z" });
      expect((await row("web", "main")).seedFromReference).toBe("api:main:2024-05-01T03:00:00Z");
      await patch({ seed_from_reference: null });
      expect((await row("web", "main")).seedFromReference).toBeNull();
      // null on an unset reference is fine too.
      await patch({ seed_from_reference: null });
    });

    it(`refuses a reference longer than ${SEED_REFERENCE_MAX} characters or not of the form <app>:<branch>:<selector> (422)`, async () => {
      const long = `web:staging:${"x".repeat(SEED_REFERENCE_MAX - "web:staging:".length + 1)}`;
      expect(await refusal(patch({ seed_from_reference: long }))).toMatchObject({ status: 422, detail: { code: "out_of_range" } });
      for (const reference of ["nonsense", "web:staging", "web::latest", ":staging:latest", "web:staging:", "Web:staging:latest", "web:bad..branch:x", "web:staging:two words"]) {
        const r = await refusal(patch({ seed_from_reference: reference }));
        expect(r.status, reference).toBe(422);
        expect(r.detail, reference).toMatchObject({ code: "invalid_format", errors: [{ field: "seed_from_reference" }] });
      }
      expect(await refusal(patch({ seed_from_reference: 7 }))).toMatchObject({ status: 422, detail: { code: "wrong_type" } });
      // The patched branch (web, main) is no source of its own data.
      expect(await refusal(patch({ seed_from_reference: "web:main:latest" }))).toMatchObject({ status: 422, detail: { code: "seed_is_this_branch" } });
      expect((await row("web", "main")).seedFromReference).toBeNull();
    });

    it("answers 404 when the source is another group's app, an unknown app or an unknown branch", async () => {
      for (const reference of ["shop:main:latest", "ghost:main:latest", "web:nope:latest"]) {
        const r = await refusal(patch({ seed_from_reference: reference }));
        expect(r.status, reference).toBe(404);
      }
      // Another group's source reads exactly like an unknown one.
      const foreign = await refusal(patch({ seed_from_reference: "shop:main:latest" }));
      const unknown = await refusal(patch({ seed_from_reference: "ghost:main:latest" }));
      expect(String(foreign.detail).replace("shop", "ghost")).toBe(String(unknown.detail));
      expect((await row("web", "main")).seedFromReference).toBeNull();
    });

    it("refuses a reference while the branch is running (409), but still clears one", async () => {
      await setRow("web", "main", { deployStatus: "running", seedFromReference: "web:staging:latest" });
      const r = await refusal(patch({ seed_from_reference: "api:main:latest", display_name: "Not applied" }));
      expect(r).toMatchObject({ status: 409, detail: { code: "app_running" } });
      const unchanged = await row("web", "main");
      expect(unchanged.seedFromReference).toBe("web:staging:latest");
      expect(unchanged.displayName).not.toBe("Not applied");
      await patch({ seed_from_reference: null });
      expect((await row("web", "main")).seedFromReference).toBeNull();
      await setRow("web", "main", { deployStatus: "undeployed" });
    });

    it("refuses a reference once the branch's first deploy has happened (409), even undeployed since", async () => {
      const firstDeployedAt = new Date("2026-11-01T10:00:00Z");
      await setRow("web", "main", { deployStatus: "undeployed", firstDeployedAt });
      const r = await refusal(patch({ seed_from_reference: "web:staging:latest" }));
      expect(r).toMatchObject({ status: 409, detail: { code: "already_seeded", first_deployed_at: firstDeployedAt.toISOString() } });
      expect((await row("web", "main")).seedFromReference).toBeNull();
      await patch({ seed_from_reference: null });
      await setRow("web", "main", { firstDeployedAt: null });
    });

    it("refuses a reference on a branch registered with a data copy scheduled (409): a first deploy restores from one source", async () => {
      await setRow("web", "main", { cloneData: { source_branch: "staging", components: { db: true, drives: true, buckets: true } } });
      const r = await refusal(patch({ seed_from_reference: "web:staging:latest" }));
      expect(r).toMatchObject({ status: 409, detail: { code: "clone_data_scheduled", clone_data_from_branch: "staging" } });
      expect((await row("web", "main")).seedFromReference).toBeNull();
      await setRow("web", "main", { cloneData: null });
    });
  });

  it("refuses unknown fields (422) and applies nothing of the body", async () => {
    const r = await refusal(patch({ display_name: "Not applied", repository: "https://example.com/x.git", colour: "blue" }));
    expect(r).toMatchObject({ status: 422, detail: { code: "unknown_field" } });
    expect(r.detail.errors.map((e: any) => e.field).sort()).toEqual(["colour", "repository"]);
    expect((await row("web", "main")).displayName).not.toBe("Not applied");
  });

  it("refuses null for every field but seed_from_reference (422)", async () => {
    for (const field of PATCH_FIELDS.filter((f) => f !== "seed_from_reference")) {
      const r = await refusal(patch({ [field]: null }));
      expect(r.status, field).toBe(422);
      expect(r.detail, field).toMatchObject({ code: "null_not_allowed", errors: [{ field, code: "null_not_allowed" }] });
    }
  });

  it("counts characters as code points: 200 emoji are a display name of 200 characters", async () => {
    const r = await patch({ display_name: "\u{1F600}".repeat(200) });
    expect(r.app?.displayName).toBe("\u{1F600}".repeat(200));
  });

  it("refuses wrong types and values (422), listing every problem", async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ display_name: 5 }, "wrong_type"],
      [{ display_name: "   " }, "invalid_value"],
      [{ display_name: "x".repeat(201) }, "out_of_range"],
      [{ display_name: "\u{1F600}".repeat(201) }, "out_of_range"],
      [{ description: "x".repeat(2001) }, "out_of_range"],
      [{ database_enabled: "true" }, "wrong_type"],
      [{ cache_enabled: 1 }, "wrong_type"],
      [{ deploy_config: [] }, "wrong_type"],
      [{ deploy_config: "database" }, "wrong_type"],
      [{ services: {} }, "wrong_type"],
      [{ containers: "redis" }, "wrong_type"],
      [{ visibility: "Public" }, "invalid_value"],
    ];
    for (const [body, code] of cases) {
      const r = await refusal(patch(body));
      expect(r.status, JSON.stringify(body)).toBe(422);
      expect(r.detail.code, JSON.stringify(body)).toBe(code);
    }
    let deep: unknown = "bottom";
    for (let i = 0; i < 20; i++) deep = { deeper: deep };
    expect(await refusal(patch({ deploy_config: deep }))).toMatchObject({ status: 422, detail: { code: "too_deep" } });

    const many = await refusal(patch({ display_name: null, visibility: "nope", colour: "blue" }));
    expect(many).toMatchObject({ status: 422, detail: { code: "invalid_patch" } });
    expect(many.detail.errors.map((e: any) => e.code).sort()).toEqual(["invalid_value", "null_not_allowed", "unknown_field"]);
    expect(await refusal(patch(["display_name"]))).toMatchObject({ status: 422, detail: { code: "invalid_body" } });
  });

  it("answers 404 for an unknown app or branch and for another group's app", async () => {
    const unknown = await refusal(patch({ display_name: "x" }, { app: "ghost" }));
    expect(unknown.status).toBe(404);
    expect((await refusal(patch({ display_name: "x" }, { branch: "nope" }))).status).toBe(404);
    const foreign = await refusal(patch({ display_name: "x" }, { caller: globex }));
    expect(foreign.status).toBe(404);
    expect(String(foreign.detail)).toBe(String(unknown.detail).replace("ghost", "web"));
    expect((await refusal(patch({ display_name: "x" }, { app: "web", caller: globex, branch: "" }))).status).toBe(404);
    expect((await row("web", "main")).displayName).not.toBe("x");
  });
});

describe("scale", () => {
  it("refuses a scale while preflight quarantines the app (409), saving nothing", async () => {
    await setRow("api", "main", { baseConfig: repoConfig(), overlay: {}, deployStatus: "running", runningVersion: "main-1", preflightStatus: "config_invalid" });
    const scale = () => client.setServiceReplicas({ caller: acme, appName: "api", branch: "main", service: "web", replicas: 2 });
    expect(await refusal(scale())).toMatchObject({ status: 409, detail: { code: "preflight_quarantined" } });
    expect((await row("api", "main")).overlay).toEqual({});
    await setRow("api", "main", { preflightStatus: "ready" });
    expect(await scale()).toMatchObject({ previous: 1, requested: 2, noop: false, overlayPaths: ["services.web.replicas"] });
    await setRow("api", "main", { baseConfig: null, overlay: {}, deployStatus: "undeployed", runningVersion: null, preflightStatus: "pending" });
  });

  it("scales the services of the release that runs: not one only a later build has, but one the latest repository config removed", async () => {
    const withExtra = repoConfig();
    withExtra.services.extra = { run: "node extra.js", port: 8081, mount: "/extra" };
    const withoutWorker = repoConfig();
    delete withoutWorker.services.worker;
    // main-1 (running) has web and worker; main-2 (built, not deployed) has extra and no worker.
    await service.ctx.write(async (em) => {
      const app = await em.findOneOrFail(App, { appName: "api", branch: "main" });
      completedBuild(em, app, "main-1", repoConfig());
      completedBuild(em, app, "main-2", { ...withoutWorker, services: { ...withoutWorker.services, extra: withExtra.services.extra } });
    });
    await setRow("api", "main", { baseConfig: { ...withoutWorker, services: { ...withoutWorker.services, extra: withExtra.services.extra } }, overlay: {}, deployStatus: "running", runningVersion: "main-1", preflightStatus: "ready" });
    const scale = (svc: string) => client.setServiceReplicas({ caller: acme, appName: "api", branch: "main", service: svc, replicas: 2 });
    expect(await refusal(scale("extra"))).toMatchObject({ status: 404, detail: { code: "service_not_declared", message: "App 'api' (branch main) declares no service 'extra' in the release it runs." } });
    expect((await row("api", "main")).overlay).toEqual({});
    expect(await scale("worker")).toMatchObject({ previous: 1, requested: 2, noop: false, overlayPaths: ["services.worker.replicas"] });
    // The latest config has no worker: its edit does not make a service of one field there.
    const config = await client.getAppConfig({ caller: acme, appName: "api", branch: "main" });
    expect(Object.keys((config.effective?.services ?? {}) as Record<string, unknown>)).toEqual(["web", "extra"]);
    await setRow("api", "main", { baseConfig: null, overlay: {}, deployStatus: "undeployed", runningVersion: null, preflightStatus: "pending" });
  });
});

describe("set-production", () => {
  it("promotes a branch and demotes the previous production branch in one transaction", async () => {
    const r = await client.setProductionBranch({ caller: acme, appName: "web", branch: "staging" });
    expect(r).toMatchObject({ appName: "web", branch: "staging", previousProductionBranch: "main", changed: true });
    expect((await row("web", "staging")).isProduction).toBe(true);
    expect((await row("web", "main")).isProduction).toBe(false);
    // The default branch of app routes follows.
    expect((await client.getApp({ caller: acme, appName: "web" })).branch).toBe("staging");
    // An app route reads its name as POST /api/builds does: `WEB` names `web`.
    expect(await client.getApp({ caller: acme, appName: "WEB", branch: "main" })).toMatchObject({ appName: "web", branch: "main" });
    expect((await client.listBranches({ caller: acme, appName: "web" })).branches.map((b) => [b.branch, b.isProduction])).toEqual([
      ["staging", true],
      ["main", false],
    ]);
  });

  it("re-asserts the routes of the deployed branches, whose front doors swap", async () => {
    await setRow("web", "staging", { deployStatus: "running", runningVersion: "staging-1" });
    const before = reconciles.length;
    await client.setProductionBranch({ caller: acme, appName: "web", branch: "main" });
    // main is undeployed: only staging, which is served at web-staging from now on, is reconciled.
    await expect.poll(() => reconciles.length, { timeout: 10_000 }).toBe(before + 1);
    expect(reconciles.at(-1)?.data).toMatchObject({ app_name: "web", branch: "staging", group_slug: "acme", requested_by: expect.stringMatching(/^api_key:/) });
    await client.setProductionBranch({ caller: acme, appName: "web", branch: "staging" });
    await expect.poll(() => reconciles.length, { timeout: 10_000 }).toBe(before + 2);
    await setRow("web", "staging", { deployStatus: "undeployed", runningVersion: null });
  });

  it("keeps a branch that may still serve: deleting it is 409 app_running until it is undeployed", async () => {
    await client.registerApp({ caller: acme, appName: "web", repository: REPOSITORY, branch: "doomed" });
    await setRow("web", "doomed", { deployStatus: "failed", runningVersion: "doomed-1" });
    expect(await refusal(client.deleteApp({ caller: acme, appName: "web", branch: "doomed" }))).toMatchObject({ status: 409, detail: { code: "app_running", deploy_status: "failed" } });
    await setRow("web", "doomed", { deployStatus: "undeploy_failed", runningVersion: null });
    expect(await refusal(client.deleteApp({ caller: acme, appName: "web", branch: "doomed" }))).toMatchObject({ status: 409, detail: { code: "app_running" } });
    await setRow("web", "doomed", { deployStatus: "failed", runningVersion: null });
    // A build of the branch not yet ended (its row stays queued while it runs) keeps it too.
    const buildId = await service.ctx.write(async (em) => {
      const id = completedBuild(em, await em.findOneOrFail(App, { appName: "web", branch: "doomed" }), "doomed-2");
      await em.flush();
      await em.nativeUpdate(Build, { id }, { status: "queued" });
      return id;
    });
    expect(await refusal(client.deleteApp({ caller: acme, appName: "web", branch: "doomed" }))).toMatchObject({ status: 409, detail: { code: "build_in_flight", build_id: buildId } });
    await service.ctx.write((em) => em.nativeUpdate(Build, { id: buildId }, { status: "cancelled" }));
    await client.deleteApp({ caller: acme, appName: "web", branch: "doomed" });
  });

  it("waits for a build that holds the branch while it decides, and then refuses build_in_flight: never deletes a build accepted meanwhile", async () => {
    await client.registerApp({ caller: acme, appName: "web", repository: REPOSITORY, branch: "raced-build" });
    await setRow("web", "raced-build", { deployStatus: "undeployed", runningVersion: null });
    // A build being accepted holds the branch's row in share mode until it commits (buildWriter).
    const accepting = new pg.Client({ connectionString: databaseUrl, options: "-c search_path=apps_builds" });
    await accepting.connect();
    try {
      await accepting.query("begin");
      await accepting.query("select 1 from apps where app_name = 'web' and branch = 'raced-build' for share");
      const deletion = refusal(client.deleteApp({ caller: acme, appName: "web", branch: "raced-build" }));
      await expect
        .poll(async () => (await accepting.query("select count(*)::int as n from pg_locks where not granted and locktype in ('transactionid', 'tuple')")).rows[0].n, { timeout: 10_000 })
        .toBeGreaterThan(0);
      const buildId = await service.ctx.write(async (em) => {
        const id = completedBuild(em, await em.findOneOrFail(App, { appName: "web", branch: "raced-build" }), "raced-build-1");
        await em.flush();
        await em.nativeUpdate(Build, { id }, { status: "queued" });
        return id;
      });
      await accepting.query("commit");
      expect(await deletion).toMatchObject({ status: 409, detail: { code: "build_in_flight", build_id: buildId } });
      await service.ctx.write((em) => em.nativeUpdate(Build, { id: buildId }, { status: "cancelled" }));
      await client.deleteApp({ caller: acme, appName: "web", branch: "raced-build" });
    } finally {
      await accepting.end();
    }
  });

  it("is a no-op for the branch that already is production", async () => {
    const before = await row("web", "staging");
    const r = await client.setProductionBranch({ caller: acme, appName: "web", branch: "staging" });
    expect(r).toMatchObject({ appName: "web", branch: "staging", previousProductionBranch: "staging", changed: false });
    expect((await row("web", "staging")).updatedAt).toEqual(before.updatedAt);
  });

  it("keeps exactly one production branch under concurrent promotions", async () => {
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => client.setProductionBranch({ caller: acme, appName: "web", branch: i % 2 ? "staging" : "main" })),
    );
    expect(results.every((r) => r.appName === "web")).toBe(true);
    const rows = await service.ctx.read((em) => em.find(App, { appName: "web" }));
    expect(rows.filter((a) => a.isProduction)).toHaveLength(1);
    await client.setProductionBranch({ caller: acme, appName: "web", branch: "main" });
    expect((await row("web", "main")).isProduction).toBe(true);
  });

  it("refuses with label_too_long (422) a branch whose host label <app>-<branch> would not fit 63 characters, registered or demoted", async () => {
    const long = "x".repeat(60);
    expect(await refusal(client.registerApp({ caller: acme, appName: "web", repository: REPOSITORY, branch: long }))).toMatchObject({
      status: 422,
      detail: { code: "label_too_long", max: 63 },
    });
    // As production it goes by the app name alone; promoting another branch would demote it.
    await client.registerApp({ caller: acme, appName: "lbl", repository: "https://example.com/acme/lbl.git", branch: long });
    await client.registerApp({ caller: acme, appName: "lbl", repository: "https://example.com/acme/lbl.git", branch: "short" });
    const demoted = await refusal(client.setProductionBranch({ caller: acme, appName: "lbl", branch: "short" }));
    expect(demoted).toMatchObject({ status: 422, detail: { code: "label_too_long" } });
    // The remedy is about the branch that would be demoted, not the one promoted.
    expect(demoted.detail.message).toContain(`The production branch '${long}' would be served there once demoted`);
    expect((await row("lbl", long)).isProduction).toBe(true);
    expect((await row("lbl", "short")).isProduction).toBe(false);
  });

  it("answers 404 for an unknown branch or app and for another group's app; 422 without a branch", async () => {
    expect((await refusal(client.setProductionBranch({ caller: acme, appName: "web", branch: "nope" }))).status).toBe(404);
    expect((await refusal(client.setProductionBranch({ caller: acme, appName: "ghost", branch: "main" }))).status).toBe(404);
    expect((await refusal(client.setProductionBranch({ caller: globex, appName: "web", branch: "staging" }))).status).toBe(404);
    expect(await refusal(client.setProductionBranch({ caller: acme, appName: "web", branch: "" }))).toMatchObject({ status: 422, detail: { code: "branch_required" } });
    expect((await row("web", "main")).isProduction).toBe(true);
    expect((await row("web", "staging")).isProduction).toBe(false);
  });
});

describe("config layers", () => {
  it("reads no config as empty layers", async () => {
    const r = await layers({ app: "api" });
    expect(r).toMatchObject({ appName: "api", branch: "main", configPath: "platform.yaml", overlay: {}, sourceMap: {} });
    expect(r.base).toBeUndefined();
    expect(r.effective).toBeUndefined();
    expect(r.effectiveYaml).toBeUndefined();
  });

  it("reads an overlay of a service no layer declares, over no base, as no effective config", async () => {
    await setRow("api", "main", { overlay: { "services.web.replicas": { value: 2, base: 1 } } });
    const r = await layers({ app: "api" });
    expect(r.overlay).toEqual({ "services.web.replicas": { value: 2, base: 1 } });
    expect(r.effective).toBeUndefined();
    expect(r.sourceMap).toEqual({});
    expect(r.effectiveYaml).toBeUndefined();
    await setRow("api", "main", { overlay: {} });
  });

  it("saves a config over no base as entirely dashboard-authored, and re-queues the preflight", async () => {
    await setRow("api", "main", { preflightStatus: "ready" });
    const before = await row("api", "main");
    const config = { services: { web: { run: "node server.js", port: 3000 } }, database: { enabled: true } };
    const r = await save({ config }, { app: "api" });
    expect(r.overlay).toEqual({
      "services.web.run": { value: "node server.js", base: null },
      "services.web.port": { value: 3000, base: null },
      "database.enabled": { value: true, base: null },
    });
    expect(r.changedPaths).toEqual(["database.enabled", "services.web.port", "services.web.run"]);
    expect(r).toMatchObject({ appliesLive: false, requiresRedeploy: true });
    const after = await row("api", "main");
    expect(after.preflightNonce).toBe(before.preflightNonce + 1);
    expect(after.preflightStatus).toBe("pending");
    expect(after.overlay).toEqual(r.overlay);
    const event = await waitFor(() => preflights.find((e) => e.data.action_id === r.preflightActionId));
    expect(event.data).toMatchObject({ app_id: before.id, nonce: after.preflightNonce });

    const read = await layers({ app: "api" });
    expect(read.base).toBeUndefined();
    expect(read.effective).toEqual(config);
    expect(read.sourceMap).toEqual({ "services.web.run": "dashboard", "services.web.port": "dashboard", "database.enabled": "dashboard" });
    const parsed = parseAppConfigYaml(read.effectiveYaml!);
    expect(parsed.ok && parsed.config).toEqual(config);
  });

  describe("over a repository base", () => {
    beforeAll(async () => {
      await setRow("web", "main", { baseConfig: repoConfig(), overlay: {} });
    });

    it("reads the base, an empty overlay, the effective config, its sources and its YAML", async () => {
      const r = await layers();
      expect(r.base).toEqual(repoConfig());
      expect(r.overlay).toEqual({});
      expect(r.effective).toEqual(repoConfig());
      expect(r.sourceMap["services.web.replicas"]).toBe("repository");
      expect(r.sourceMap["cron[nightly].enabled"]).toBe("repository");
      expect(Object.values(r.sourceMap).every((s) => s === "repository")).toBe(true);
      const parsed = parseAppConfigYaml(r.effectiveYaml!);
      expect(parsed.ok && parsed.config).toEqual(repoConfig());
    });

    it("stores only the differences from the base, from YAML, and reports that they need a redeploy", async () => {
      const { effectiveYaml } = await layers();
      const r = await save({ config_yaml: effectiveYaml!.replace("replicas: 1", "replicas: 2") });
      expect(r.overlay).toEqual({ "services.web.replicas": { value: 2, base: 1 } });
      expect(r.changedPaths).toEqual(["services.web.replicas"]);
      expect(r).toMatchObject({ appliesLive: false, requiresRedeploy: true });
      expect(r.preflightActionId).toMatch(/^[0-9a-f-]{36}$/);

      const read = await layers();
      expect(read.overlay).toEqual(r.overlay);
      expect(read.sourceMap["services.web.replicas"]).toBe("dashboard");
      expect(read.sourceMap["services.web.port"]).toBe("repository");
      expect((read.effective as any).services.web.replicas).toBe(2);
      expect(read.effectiveYaml).toContain("replicas: 2");
      expect(read.base).toEqual(repoConfig());
    });

    it("reports a cron-only change as applying live", async () => {
      const config = repoConfig();
      config.services.web.replicas = 2;
      config.cron[0].enabled = false;
      const r = await save({ config });
      expect(r.overlay).toEqual({ "services.web.replicas": { value: 2, base: 1 }, "cron[nightly].enabled": { value: false, base: true } });
      expect(r.changedPaths).toEqual(["cron[nightly].enabled"]);
      expect(r).toMatchObject({ appliesLive: true, requiresRedeploy: false });
    });

    it("refuses every bad save with 422 {code, message, errors} and stores nothing", async () => {
      const before = await row("web", "main");
      const omitted = repoConfig();
      delete omitted.services.web.health;
      const invalid = repoConfig();
      invalid.services.web.replicas = 9;
      let deep: any = {};
      for (let i = 0; i < 20; i++) deep = { x: deep };
      const cases: Array<[unknown, string]> = [
        [{ config: repoConfig(), config_yaml: "type: container" }, "both_config_fields"],
        [{}, "missing_config"],
        [{ config_yaml: 5 }, "config_yaml_not_string"],
        [{ config_yaml: "services:\n  web: [unclosed" }, "yaml_syntax"],
        [{ config_yaml: "- a\n- b\n" }, "not_a_mapping"],
        [{ config: [repoConfig()] }, "not_a_mapping"],
        [{ config_yaml: `# ${"x".repeat(70 * 1024)}\ntype: container\n` }, "too_large"],
        [{ config: deep }, "too_deep"],
        [{ config: invalid }, "out_of_range"],
        [{ config: omitted }, "omitted_repository_field"],
        [["config"], "invalid_body"],
      ];
      for (const [body, code] of cases) {
        const r = await refusal(save(body));
        expect(r.status, code).toBe(422);
        expect(r.detail.code, code).toBe(code);
        expect(typeof r.detail.message, code).toBe("string");
        expect(r.detail.errors.length, code).toBeGreaterThan(0);
        expect(r.detail.errors[0].code, code).toBe(code);
      }
      const syntax = await refusal(save({ config_yaml: "services:\n  web: [unclosed" }));
      expect(syntax.detail.errors[0]).toMatchObject({ line: expect.any(Number), column: expect.any(Number) });
      expect((await refusal(save({ config: invalid }))).detail.errors[0]).toMatchObject({ path: "services.web.replicas" });
      expect((await refusal(save({ config: omitted }))).detail.errors[0]).toMatchObject({ path: "services.web.health" });
      // Several omissions: the message names each path once, not every path in every sentence.
      const bare = repoConfig();
      delete bare.services.web.health;
      delete bare.services.web.replicas;
      const many = (await refusal(save({ config: bare }))).detail;
      expect(many.errors.map((e: { path: string }) => e.path).sort()).toEqual(["services.web.health", "services.web.replicas"]);
      expect(many.message).toMatch(/^2 paths were refused \(services\.web\.\w+, services\.web\.\w+\): each is defined in the repository's config and was omitted/);

      const after = await row("web", "main");
      expect(after.overlay).toEqual(before.overlay);
      expect(after.preflightNonce).toBe(before.preflightNonce);
    });

    it("renders no YAML when the effective config fails validation", async () => {
      const broken = repoConfig();
      broken.services.web.replicas = 9;
      await setRow("web", "staging", { baseConfig: broken, overlay: {} });
      const r = await layers({ branch: "staging" });
      expect((r.effective as any).services.web.replicas).toBe(9);
      expect(r.effectiveYaml).toBeUndefined();
    });
  });

  it("answers 404 for another group's app, an unknown app or branch", async () => {
    expect((await refusal(layers({ caller: globex }))).status).toBe(404);
    expect((await refusal(layers({ app: "ghost" }))).status).toBe(404);
    expect((await refusal(layers({ branch: "nope" }))).status).toBe(404);
    expect((await refusal(save({ config: repoConfig() }, { caller: globex }))).status).toBe(404);
    expect((await refusal(save({ config: repoConfig() }, { app: "ghost" }))).status).toBe(404);
  });
});

/**
 * The gateway's routes over this service. Access (credentials, scope, group selection) is the
 * gateway's own and tested there; here a header picks the caller, to check what these routes do
 * with the body: it reaches the service as sent, before the schema could coerce or strip it.
 */
describe("through the gateway's routes", () => {
  let http: FastifyInstance;

  beforeAll(async () => {
    http = Fastify();
    registerErrorHandling(http);
    for (const schema of sharedSchemas) http.addSchema(schema);
    http.decorateRequest("caller", null);
    http.addHook("onRequest", async (request) => {
      request.caller = request.headers["x-test-group"] === "globex" ? globex : acme;
    });
    appSettingsRoutes(http, client);
    await http.ready();
  });

  afterAll(async () => {
    await http?.close();
  });

  const call = (method: "PATCH" | "POST" | "GET" | "PUT", url: string, payload?: unknown, group = "acme") =>
    http.inject({ method, url, headers: { "x-test-group": group }, ...(payload === undefined ? {} : { payload: payload as object }) });

  it("PATCH answers the app, and refuses unknown fields, nulls and wrong types instead of dropping or coercing them", async () => {
    const ok = await call("PATCH", "/api/apps/web?branch=main", { display_name: "Web", seed_from_reference: null });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({ app_name: "web", branch: "main", display_name: "Web", is_production: true, urls: [], last_deploy_status: null });
    expect(ok.json()).not.toHaveProperty("preflight_action_id");

    const moved = await call("PATCH", "/api/apps/web?branch=main", { config_path: "web/platform.yaml" });
    expect(moved.statusCode).toBe(200);
    expect(moved.json()).toMatchObject({ config_path: "web/platform.yaml", preflight_status: "pending", preflight_action_id: expect.any(String) });

    const unknown = await call("PATCH", "/api/apps/web?branch=main", { display_name: "Other", colour: "blue" });
    expect(unknown.statusCode).toBe(422);
    expect(unknown.json().detail).toMatchObject({ code: "unknown_field", errors: [{ field: "colour" }] });
    expect((await row("web", "main")).displayName).toBe("Web");

    const nulled = await call("PATCH", "/api/apps/web?branch=main", { display_name: null });
    expect(nulled.statusCode).toBe(422);
    expect(nulled.json().detail.code).toBe("null_not_allowed");
    const flag = await call("PATCH", "/api/apps/web?branch=main", { database_enabled: "true" });
    expect(flag.statusCode).toBe(422);
    expect(flag.json().detail.code).toBe("wrong_type");

    expect((await call("PATCH", "/api/apps/web?branch=main", { display_name: "x" }, "globex")).statusCode).toBe(404);
  });

  it("set-production answers {app_name, branch, previous_production_branch, changed}, and 422 without a branch", async () => {
    const r = await call("POST", "/api/apps/web/set-production?branch=staging");
    expect(r.statusCode).toBe(200);
    expect(r.json()).toEqual({ app_name: "web", branch: "staging", previous_production_branch: "main", changed: true });
    const back = await call("POST", "/api/apps/web/set-production?branch=main");
    expect(back.json()).toEqual({ app_name: "web", branch: "main", previous_production_branch: "staging", changed: true });
    expect((await call("POST", "/api/apps/web/set-production")).statusCode).toBe(422);
    expect((await call("POST", "/api/apps/web/set-production?branch=nope")).statusCode).toBe(404);
  });

  it("GET config answers every layer, with nulls where there is none", async () => {
    await client.registerApp({ caller: acme, appName: "bare", repository: "https://example.com/acme/bare.git" });
    const empty = await call("GET", "/api/apps/bare/config");
    expect(empty.statusCode).toBe(200);
    expect(empty.json()).toEqual({
      app_name: "bare",
      branch: "main",
      config_path: "platform.yaml",
      base: null,
      overlay: {},
      effective: null,
      source_map: {},
      effective_yaml: null,
    });
    // As the preflight of the file PATCH moved it to (above) would have read it.
    await setRow("web", "main", { baseConfig: repoConfig() });
    const full = await call("GET", "/api/apps/web/config?branch=main");
    expect(full.json()).toMatchObject({ base: repoConfig(), overlay: { "services.web.replicas": { value: 2, base: 1 } }, source_map: { "services.web.replicas": "dashboard" } });
    expect(full.json().effective_yaml).toContain("replicas: 2");
  });

  it("PUT config answers the save, and leaves every refusal to the pipeline's codes", async () => {
    const r = await call("PUT", "/api/apps/bare/config", { config: { services: { web: { run: "node server.js", port: 3000 } } } });
    expect(r.statusCode).toBe(200);
    expect(r.json()).toMatchObject({
      overlay: { "services.web.run": { value: "node server.js", base: null } },
      changed_paths: ["services.web.port", "services.web.run"],
      applies_live: false,
      requires_redeploy: true,
      preflight_action_id: expect.any(String),
    });
    const notString = await call("PUT", "/api/apps/bare/config", { config_yaml: 5 });
    expect(notString.statusCode).toBe(422);
    expect(notString.json().detail).toMatchObject({ code: "config_yaml_not_string", errors: [{ code: "config_yaml_not_string" }] });
    const notObject = await call("PUT", "/api/apps/bare/config", { config: "type: static" });
    expect(notObject.statusCode).toBe(422);
    expect(notObject.json().detail.code).toBe("not_a_mapping");
  });
});
