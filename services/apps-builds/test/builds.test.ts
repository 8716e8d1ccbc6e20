/**
 * Triggering builds against the real Postgres and NATS (spec doc 1 sections 3.1, 4.3), through
 * apps-builds' Connect API: the builds row and its build_requested event written together, the
 * refusals (preflight quarantine, another repository) said from what the apps row holds now even
 * right after a build of the same app, auto-registration, and the tag retried on a collision.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { appsBuildsEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { makeCaller, type Caller } from "@platform/caller";
import { connectBus, subjects, subscribe, type Bus, type EventEnvelope } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createTestDatabase, deleteBusStreams, dropDatabase, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { routerSettings } from "../src/rpc.ts";
import { buildRowsWritten, resolveClaimedRelease } from "../src/domain/releases.ts";
import { applyActionUpdates, type ActionUpdate } from "../src/domain/builds.ts";
import { startIdentity, type TestIdentity } from "./identity.ts";

const logger = createLogger({ service: "apps-builds-test", level: "silent", pretty: false });
const REPOSITORY = "https://example.com/acme/shop.git";

let databaseUrl: string;
let prefix: string;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof AppsBuildsService>>;
let bus: Bus;
let db: pg.Client;
let identity: TestIdentity;
const requested: EventEnvelope[] = [];

const acme: Caller = makeCaller({ kind: "api_key", principalId: "k-acme", scope: "deploy", visibleGroups: ["acme"], selectedGroup: "acme" });
const beta: Caller = makeCaller({ kind: "api_key", principalId: "k-beta", scope: "deploy", visibleGroups: ["beta"], selectedGroup: "beta" });


const trigger = (overrides: { appName?: string; repository?: string; skipPreflight?: boolean; autoDeploy?: boolean } = {}) =>
  client.triggerBuild({ caller: acme, appName: "shop", repository: REPOSITORY, branch: "main", autoDeploy: false, configPath: "", skipPreflight: false, ...overrides });

const preflight = (status: string) => db.query("update apps_builds.apps set preflight_status = $1 where app_name = 'shop' and branch = 'main'", [status]);

async function buildRows(app = "shop") {
  const r = await db.query<{ id: string; tag: string; status: string; queue_status: string; auto_deploy: boolean; deploy_action_id: string | null }>(
    "select id, tag, status, queue_status, auto_deploy, deploy_action_id from apps_builds.builds where app_name = $1 order by created_at",
    [app],
  );
  return r.rows;
}

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  // Registrations (auto-registration included) take the group lock from identity.
  identity = await startIdentity({ databaseUrl, prefix, groups: ["acme", "beta"] });
  service = await build(
    loadConfig(appsBuildsEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent", IDENTITY_URL: identity.url }),
  );
  client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${service.rpc.port}`);
  bus = await connectBus({ url: testNatsUrl(), name: "apps-builds-builds-test", prefix });
  subscribe(bus, subjects.events.buildRequested, (e) => void requested.push(e), logger);
  db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
  await client.registerApp({ caller: acme, appName: "shop", repository: REPOSITORY });
});

afterAll(async () => {
  await db?.end();
  await bus?.close();
  await service?.close();
  await identity?.service.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

describe("POST /api/builds", () => {
  it("refuses a quarantined app, then writes the queued row and its event once preflight passes", async () => {
    expect(await refusal(trigger())).toMatchObject({ status: 409, detail: { code: "preflight_quarantined", preflight_status: "pending" } });
    await preflight("ready");
    const asked = Date.now();
    const r = await trigger({ autoDeploy: true });
    const answered = Date.now();
    expect(r).toMatchObject({ status: "queued", registered: false });
    expect(r.actionId).toBe(r.buildId);
    expect(r.tag).toMatch(/^main-[0-9a-f]{8}$/);
    const [row] = await buildRows();
    expect(row).toMatchObject({ id: r.buildId, tag: r.tag, status: "queued", queue_status: "queued", auto_deploy: true });
    expect(row!.deploy_action_id).toMatch(/^[0-9a-f-]{36}$/);
    await expect.poll(() => requested.find((e) => e.data.build_id === r.buildId), { timeout: 10_000 }).toBeDefined();
    expect(requested.find((e) => e.data.build_id === r.buildId)!.data).toEqual({
      build_id: r.buildId,
      deploy_action_id: row!.deploy_action_id,
      app_name: "shop",
      branch: "main",
      group_slug: "acme",
      tag: r.tag,
      repository: REPOSITORY,
      config_path: "platform.yaml",
      auto_deploy: true,
      created_by: "api_key:k-acme",
      requested_at: expect.any(String),
      // Nothing serves yet: the auto-deploy replaces nothing.
      previous_tag: null,
    });
    // When the build was asked for, however late the event reaches the queue.
    const requestedAt = Date.parse(requested.find((e) => e.data.build_id === r.buildId)!.data.requested_at as string);
    expect(requestedAt).toBeGreaterThanOrEqual(asked);
    expect(requestedAt).toBeLessThanOrEqual(answered);
  });

  it("names the tag serving when it was asked for in the event, for its auto-deploy's previous_tag, undeployed or not", async () => {
    await preflight("ready");
    const eventOf = async (buildId: string) => {
      await expect.poll(() => requested.find((e) => e.data.build_id === buildId), { timeout: 10_000 }).toBeDefined();
      return requested.find((e) => e.data.build_id === buildId)!.data;
    };
    await db.query("update apps_builds.apps set deploy_status = 'running', running_version = 'main-00000001' where app_name = 'shop' and branch = 'main'");
    // Twice: the second is written from what this process remembers of the app, and still reads the row.
    expect(await eventOf((await trigger({ autoDeploy: true })).buildId)).toMatchObject({ previous_tag: "main-00000001" });
    await db.query("update apps_builds.apps set running_version = 'main-00000002' where app_name = 'shop' and branch = 'main'");
    expect(await eventOf((await trigger({ autoDeploy: true })).buildId)).toMatchObject({ previous_tag: "main-00000002" });
    await db.query("update apps_builds.apps set deploy_status = 'undeployed' where app_name = 'shop' and branch = 'main'");
    expect(await eventOf((await trigger({ autoDeploy: true })).buildId)).toMatchObject({ previous_tag: null });
  });

  it("says a refusal from what the apps row holds now, right after a build of the same app", async () => {
    await trigger();
    await preflight("no_access");
    expect(await refusal(trigger())).toMatchObject({ status: 409, detail: { code: "preflight_quarantined", preflight_status: "no_access" } });
    // skip_preflight still builds.
    expect(await trigger({ skipPreflight: true })).toMatchObject({ status: "queued" });
    await preflight("ready");
    expect(await trigger()).toMatchObject({ status: "queued" });

    await db.query("update apps_builds.apps set repository = 'https://example.com/acme/other.git', repository_key = 'example.com/acme/other' where app_name = 'shop'");
    expect(await refusal(trigger())).toMatchObject({ status: 409, detail: { code: "repository_mismatch", repository: "https://example.com/acme/other.git" } });
    await db.query("update apps_builds.apps set repository = $1, repository_key = 'example.com/acme/shop' where app_name = 'shop'", [REPOSITORY]);
    expect(await trigger()).toMatchObject({ status: "queued" });
  });

  it("builds with the app's current values after they change", async () => {
    await trigger();
    await db.query("update apps_builds.apps set config_path = 'deploy/platform.yaml', display_name = 'Shop' where app_name = 'shop'");
    const r = await trigger();
    await expect.poll(() => requested.find((e) => e.data.build_id === r.buildId), { timeout: 10_000 }).toBeDefined();
    expect(requested.find((e) => e.data.build_id === r.buildId)!.data.config_path).toBe("deploy/platform.yaml");
    const display = await db.query("select display_name from apps_builds.builds where id = $1", [r.buildId]);
    expect(display.rows[0]).toEqual({ display_name: "Shop" });
  });

  it("registers an app it does not know and refuses its build until preflight passes, the registration kept", async () => {
    const refused = await refusal(trigger({ appName: "Wiki", repository: "https://example.com/acme/wiki.git" }));
    expect(refused).toMatchObject({ status: 409, detail: { code: "preflight_quarantined", preflight_status: "pending", registered: true } });
    expect(refused.detail.message).toMatch(/was registered in group acme/);
    const apps = await db.query("select preflight_status from apps_builds.apps where app_name = 'wiki'");
    expect(apps.rows).toEqual([{ preflight_status: "pending" }]);
    expect(await buildRows("wiki")).toEqual([]);
    // Asked again before the check has passed: refused as any quarantined app, nothing registered twice.
    expect(await refusal(trigger({ appName: "Wiki", repository: "https://example.com/acme/wiki.git" }))).toMatchObject({
      status: 409,
      detail: { code: "preflight_quarantined", preflight_status: "pending" },
    });
    await db.query("update apps_builds.apps set preflight_status = 'ready' where app_name = 'wiki'");
    expect(await trigger({ appName: "Wiki", repository: "https://example.com/acme/wiki.git" })).toMatchObject({ status: "queued", registered: false });
    expect(await buildRows("wiki")).toHaveLength(1);
  });

  it("registers an app it does not know, and again one deleted since its last build", async () => {
    const first = await trigger({ appName: "Blog", repository: "https://example.com/acme/blog.git", skipPreflight: true });
    expect(first).toMatchObject({ status: "queued", registered: true });
    expect(await trigger({ appName: "Blog", repository: "https://example.com/acme/blog.git", skipPreflight: true })).toMatchObject({ registered: false });
    await db.query("delete from apps_builds.apps where app_name = 'blog'");
    const again = await trigger({ appName: "Blog", repository: "https://example.com/acme/blog.git", skipPreflight: true });
    expect(again).toMatchObject({ status: "queued", registered: true });
    expect((await buildRows("blog")).map((b) => b.id)).toEqual([again.buildId]);
  });

  it("writes every build of a burst once, each with its own tag", async () => {
    const before = (await buildRows()).length;
    const results = await Promise.all(Array.from({ length: 40 }, () => trigger()));
    const rows = await buildRows();
    expect(rows.length).toBe(before + 40);
    expect(new Set(rows.map((r) => r.tag)).size).toBe(rows.length);
    for (const r of results) expect(rows.some((row) => row.id === r.buildId && row.tag === r.tag)).toBe(true);
  });
  it("gives each build of a burst its own answer when builds of several apps share a statement", async () => {
    await preflight("ready");
    await client.registerApp({ caller: acme, appName: "cart", repository: "https://example.com/acme/cart.git" });
    await db.query("update apps_builds.apps set preflight_status = 'ready' where app_name = 'cart'");
    const cartBuild = await trigger({ appName: "cart", repository: "https://example.com/acme/cart.git" });
    await trigger();
    // What this process remembers of both apps is now stale: the statement finds each row changed,
    // shop's in a way that still builds, cart's in one that refuses.
    await db.query("update apps_builds.apps set display_name = 'Shop Burst' where app_name = 'shop'");
    await db.query("update apps_builds.apps set preflight_status = 'pending' where app_name = 'cart'");
    const burst = await Promise.all(
      Array.from({ length: 30 }, (_, i) =>
        i % 3 === 2 ? refusal(trigger({ appName: "cart", repository: "https://example.com/acme/cart.git" })) : trigger(),
      ),
    );
    for (const [i, r] of burst.entries()) {
      if (i % 3 === 2) expect(r).toMatchObject({ status: 409, detail: { code: "preflight_quarantined" } });
      else expect(r).toMatchObject({ status: "queued" });
    }
    const ids = burst.filter((_, i) => i % 3 !== 2).map((r) => (r as { buildId: string }).buildId);
    const rows = await db.query<{ display_name: string }>("select display_name from apps_builds.builds where id = any($1::uuid[])", [ids]);
    expect(rows.rows.map((r) => r.display_name)).toEqual(ids.map(() => "Shop Burst"));
    expect((await buildRows("cart")).map((b) => b.id)).toEqual([cartBuild.buildId]);
  });
});

describe("POST /api/builds input", () => {
  it("refuses a repository that is no URL with 422 for a registered app too", async () => {
    await preflight("ready");
    for (const repository of ["garbage", "", "https:// spaced"]) {
      expect(await refusal(trigger({ repository })), repository).toMatchObject({ status: 422, detail: { code: "repository_host_unsupported" } });
    }
  });

  it("finds a build by tag only in the group an operator names", async () => {
    await preflight("ready");
    const r = await trigger();
    const operator = (group?: string) =>
      makeCaller({ kind: "api_key", principalId: "k-op", scope: "admin", platformOperator: true, visibleGroups: ["acme", "beta"], selectedGroup: group ?? "", explicitGroup: group !== undefined });
    expect(await client.getBuildByTag({ caller: operator(), appName: "shop", tag: r.tag })).toMatchObject({ id: r.buildId });
    expect(await client.getBuildByTag({ caller: operator("acme"), appName: "shop", tag: r.tag })).toMatchObject({ id: r.buildId });
    expect(await refusal(client.getBuildByTag({ caller: operator("beta"), appName: "shop", tag: r.tag }))).toMatchObject({ status: 404 });
  });

  it("lets an operator who names no group build a registered app in the group that has it; a new app needs ?group=", async () => {
    await preflight("ready");
    const operator = makeCaller({ kind: "api_key", principalId: "k-op", scope: "admin", platformOperator: true, platformRoot: true });
    const r = await client.triggerBuild({ caller: operator, appName: "shop", repository: REPOSITORY, branch: "main", autoDeploy: false, configPath: "", skipPreflight: false });
    expect(r).toMatchObject({ status: "queued", registered: false, appName: "shop" });
    expect((await client.getBuild({ caller: acme, buildId: r.buildId })).groupSlug).toBe("acme");
    const fresh = refusal(client.triggerBuild({ caller: operator, appName: "brand-new", repository: "https://example.com/acme/brand-new.git", branch: "main", autoDeploy: false, configPath: "", skipPreflight: true }));
    expect(await fresh).toMatchObject({ status: 422 });
  });

  it("builds a registered app whatever spaces surround its branch", async () => {
    await preflight("ready");
    const r = await client.triggerBuild({ caller: acme, appName: "shop", repository: REPOSITORY, branch: " main ", autoDeploy: false, configPath: "", skipPreflight: false });
    expect(r).toMatchObject({ status: "queued", registered: false });
    expect((await buildRows()).some((b) => b.id === r.buildId)).toBe(true);
  });
});

describe("registrations at the same moment", () => {
  it("lets only one of two registrations of one repository under two names through", async () => {
    for (let round = 0; round < 3; round++) {
      const repository = `https://example.com/acme/twin-${round}.git`;
      const outcomes = await Promise.allSettled([
        client.registerApp({ caller: acme, appName: `twin-a-${round}`, repository }),
        client.registerApp({ caller: acme, appName: `twin-b-${round}`, repository }),
      ]);
      expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(1);
      const refused = outcomes.find((o) => o.status === "rejected")!;
      expect(await refusal(Promise.reject((refused as PromiseRejectedResult).reason))).toMatchObject({ status: 409, detail: { code: "repository_already_registered" } });
      const rows = await db.query("select app_name from apps_builds.apps where repository_key = $1", [`example.com/acme/twin-${round}`]);
      expect(rows.rows).toHaveLength(1);
    }
  });

  it("gives a new app the next suffix when another group is registering that suffix as its name", async () => {
    for (let round = 0; round < 3; round++) {
      const base = `race${round}`;
      await client.registerApp({ caller: acme, appName: base, repository: `https://example.com/acme/${base}.git` });
      // beta's `race<n>` becomes `race<n>-2`, the very name acme registers meanwhile.
      const [suffixed, named] = await Promise.all([
        client.registerApp({ caller: beta, appName: base, repository: `https://example.com/beta/${base}.git` }),
        client.registerApp({ caller: acme, appName: `${base}-2`, repository: `https://example.com/acme/${base}-2.git` }),
      ]);
      // Whichever commits first has `race<n>-2`; the other takes the next free name, never a 500.
      const names = [suffixed.app?.appName, named.app?.appName];
      expect([
        [`${base}-3`, `${base}-2`],
        [`${base}-2`, `${base}-2-2`],
      ]).toContainEqual(names);
    }
  });

  it("knows a suffixed app's branches by the name it was first registered by, whichever name registered them", async () => {
    const repository = "https://example.com/beta/basket.git";
    await client.registerApp({ caller: acme, appName: "basket", repository: "https://example.com/acme/basket.git" });
    expect((await client.registerApp({ caller: beta, appName: "basket", repository })).app?.appName).toBe("basket-2");
    // A branch registered under the suffixed name.
    expect((await client.registerApp({ caller: beta, appName: "basket-2", repository, branch: "dev" })).app?.branch).toBe("dev");
    // Named as first registered: the branch exists (not a taken host label).
    expect(await refusal(client.registerApp({ caller: beta, appName: "basket", repository, branch: "dev" }))).toMatchObject({ status: 409, detail: { code: "app_exists" } });
    // And a build of it under that name builds that branch.
    await db.query("update apps_builds.apps set preflight_status = 'ready' where app_name = 'basket-2'");
    const built = await client.triggerBuild({ caller: beta, appName: "basket", repository, branch: "dev", autoDeploy: false, configPath: "", skipPreflight: false });
    expect({ appName: built.appName, registered: built.registered }).toEqual({ appName: "basket-2", registered: false });
  });

  it("registers an app named after a word of a route under the next suffix", async () => {
    const r = await client.registerApp({ caller: acme, appName: "ID", repository: "https://example.com/acme/id.git" });
    expect(r.app?.appName).toBe("id-2");
  });
});

describe("the release of a claimed deploy", () => {
  it("waits for its build's completion to reach the builds row, a bounded while", async () => {
    await preflight("ready");
    const r = await trigger();
    const query = { appName: "shop", branch: "main", imageTag: r.tag, groupSlug: "acme", skipPreflight: true };
    const router = routerSettings(service.ctx.config as never);
    await expect(resolveClaimedRelease(service.ctx.read, query, router, 100)).rejects.toThrow(`has no successful build tagged '${r.tag}'`);

    // The queue's completion arrives while the agent's release waits.
    setTimeout(() => void db.query("update apps_builds.builds set status = 'completed', config = $2 where id = $1", [r.buildId, { type: "container", services: {} }]), 200);
    const release = await resolveClaimedRelease(service.ctx.read, query, router, 4000);
    expect(release).toMatchObject({ imageTag: r.tag, buildId: r.buildId });

    // The tracker's word that it wrote builds rows ends the wait (the poll would take a minute here).
    const next = await trigger();
    const waiting = resolveClaimedRelease(service.ctx.read, { ...query, imageTag: next.tag }, router, 120_000, 60_000);
    await new Promise((r) => setTimeout(r, 100));
    await db.query("update apps_builds.builds set status = 'completed', config = $2 where id = $1", [next.buildId, { type: "container", services: {} }]);
    buildRowsWritten.notify();
    expect(await waiting).toMatchObject({ imageTag: next.tag, buildId: next.buildId });

    // A build that failed is refused at once.
    const failed = await trigger();
    await db.query("update apps_builds.builds set status = 'failed' where id = $1", [failed.buildId]);
    const started = Date.now();
    await expect(resolveClaimedRelease(service.ctx.read, { ...query, imageTag: failed.tag }, router, 4000)).rejects.toThrow("has no successful build");
    expect(Date.now() - started).toBeLessThan(1000);
  });
});

describe("builds finishing out of order", () => {
  const completion = (buildId: string, service: string): ActionUpdate => ({
    action_id: buildId,
    action_type: "BUILD",
    status: "completed",
    completed_at: new Date().toISOString(),
    result: { config: { type: "container", services: { [service]: { run: "node server.js", port: 8080 } } } },
  });
  const app = async () => (await db.query("select latest_build, base_config, service_names from apps_builds.apps where app_name = 'late' and branch = 'main'")).rows[0];

  it("leave the app's latest build and base config at the newest build's, one by one or in one batch", async () => {
    await preflight("ready");
    await client.registerApp({ caller: acme, appName: "late", repository: "https://example.com/acme/late.git" });
    await db.query("update apps_builds.apps set preflight_status = 'ready' where app_name = 'late'");
    const build = () => trigger({ appName: "late", repository: "https://example.com/acme/late.git" });
    const [older, newer] = [await build(), await build()];
    await service.ctx.write((em) => applyActionUpdates(em, [completion(newer.buildId, "web")]));
    await service.ctx.write((em) => applyActionUpdates(em, [completion(older.buildId, "old")]));
    expect(await app()).toMatchObject({ latest_build: newer.tag, service_names: ["web"], base_config: { services: { web: {} } } });

    const [first, second] = [await build(), await build()];
    await service.ctx.write((em) => applyActionUpdates(em, [completion(second.buildId, "api"), completion(first.buildId, "old")]));
    expect(await app()).toMatchObject({ latest_build: second.tag, service_names: ["api"], base_config: { services: { api: {} } } });
    expect((await buildRows("late")).map((b) => b.status)).toEqual(["completed", "completed", "completed", "completed"]);
  });
});
