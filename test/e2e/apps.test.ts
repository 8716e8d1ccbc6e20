/**
 * Apps through HTTP only (spec doc 1 sections 2.1, 3.3, 4.4): registration rules, the preflight
 * quarantine reaching each of its four outcomes through a real agent and real git, and another
 * tenant's app answering 404, never 403.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { makeFixtureRepo, type FixtureRepo } from "../fixtures/git.ts";
import { call } from "./support.ts";

let fleet: TestFleet;
let api: string;
let acme: string;
let acmeRead: string;
let globex: string;
let preflightActionId: string;
const repos: Record<string, FixtureRepo> = {};

async function key(group: string, scope: string) {
  const r = await call(api, "POST", "/keys", { credential: fleet.rootKey, body: { name: `${group}-${scope}`, scope, group } });
  return r.body.key as string;
}

async function preflightOf(credential: string, app: string, branch = "main") {
  const r = await call(api, "GET", `/apps/${app}?branch=${encodeURIComponent(branch)}`, { credential });
  return r.body;
}

beforeAll(async () => {
  fleet = await startTestFleet();
  api = fleet.api;
  for (const slug of ["acme", "globex"]) await call(api, "POST", "/groups", { credential: fleet.rootKey, body: { slug } });
  acme = await key("acme", "admin");
  acmeRead = await key("acme", "read");
  globex = await key("globex", "admin");
  for (const name of ["node-web", "failing-build", "no-config", "invalid-config"] as const) repos[name] = await makeFixtureRepo(name);
});

afterAll(async () => {
  await fleet?.stop();
  for (const r of Object.values(repos)) await r.cleanup();
});

describe("registration", () => {
  it("registers an app quarantined at pending, with every field of the app shape", async () => {
    const r = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "Node Web", repository: repos["node-web"]!.url } });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({
      app_name: "node-web",
      slug: "node-web",
      display_name: "Node Web",
      group_slug: "acme",
      branch: "main",
      config_path: "platform.yaml",
      deploy_status: "undeployed",
      visibility: "public",
      is_production: true,
      latest_build: null,
      build_count: 0,
      running_version: null,
      running_build_id: null,
      running_since: null,
      urls: [],
      database_enabled: false,
      preflight_status: "pending",
      deploy_warning: null,
      warnings: [],
      last_deploy_status: null,
      last_build_status: null,
      preflight_action_id: expect.any(String),
    });
    preflightActionId = r.body.preflight_action_id;
  });

  it("reaches ready once an agent has checked the repository and its config", async () => {
    await expect.poll(async () => (await preflightOf(acme, "node-web")).preflight_status, { timeout: 30_000, interval: 250 }).toBe("ready");
    const app = await preflightOf(acme, "node-web");
    expect(app.preflight_result).toMatchObject({ reason: "ready", services: ["web"], missing_paths: [], errors: [] });
    expect(app.services).toEqual([{ name: "web", url: null }]);
  });

  it("shows the preflight it answered as a GIT_PREFLIGHT action of the queue, only to the app's group", async () => {
    await expect
      .poll(async () => (await call(api, "GET", `/deployments/queue/${preflightActionId}`, { credential: acme })).body, { timeout: 15_000, interval: 250 })
      .toMatchObject({ action_id: preflightActionId, action_type: "GIT_PREFLIGHT", app_name: "node-web", branch: "main", status: "completed" });
    const all = await call(api, "GET", "/deployments/queue?all=true&app_name=node-web", { credential: acme });
    expect(all.body.map((a: { action_id: string }) => a.action_id)).toContain(preflightActionId);
    const diagnosis = await call(api, "GET", `/deployments/queue/${preflightActionId}/diagnose`, { credential: acme });
    expect(diagnosis.status).toBe(200);
    expect((await call(api, "GET", `/deployments/queue/${preflightActionId}`, { credential: globex })).status).toBe(404);
  });

  it("refuses the same name and branch, and the same repository under another name, with 409", async () => {
    const dup = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "node-web", repository: repos["node-web"]!.url } });
    expect(dup.status).toBe(409);
    expect(dup.body.detail.code).toBe("app_exists");
    const twin = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "other", repository: repos["node-web"]!.url.replace(/\.git$/, "") } });
    expect(twin.status).toBe(409);
    expect(twin.body.detail).toMatchObject({ code: "repository_already_registered", app_name: "node-web" });
    // The config path is compared normalised: `./platform.yaml` is the same file.
    const dotted = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "other", repository: repos["node-web"]!.url, config_path: "./platform.yaml" } });
    expect(dotted.status).toBe(409);
    expect(dotted.body.detail.code).toBe("repository_already_registered");
  });

  it("stores the deploy settings sent with a registration, deriving omitted flags from deploy_config", async () => {
    const body = {
      app_name: "settings",
      repository: "https://example.com/acme/settings.git",
      config_path: "./deploy/./platform.yaml",
      deploy_config: { database: { enabled: true }, cache: { enabled: true } },
      services: [{ name: "web" }],
      containers: [],
      cache_enabled: false,
    };
    const r = await call(api, "POST", "/apps", { credential: acme, body });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ config_path: "deploy/platform.yaml", database_enabled: true, cache_enabled: false, email_enabled: false });
    expect((await call(api, "DELETE", "/apps/settings", { credential: acme })).status).toBe(204);

    const refused = async (extra: Record<string, unknown>) =>
      call(api, "POST", "/apps", { credential: acme, body: { app_name: "unsaved", repository: "https://example.com/acme/unsaved.git", ...extra } });
    expect((await refused({ deploy_config: [1] })).status).toBe(422);
    let deep: Record<string, unknown> = { leaf: true };
    for (let i = 0; i < 20; i++) deep = { next: deep };
    expect((await refused({ deploy_config: deep })).status).toBe(422);
    expect((await refused({ git_clone_provider: "bitbucket" })).status).toBe(422);
    expect(await refused({ git_clone_provider: "github" })).toMatchObject({ status: 422, body: { detail: { code: "no_user_session" } } });
    expect((await call(api, "GET", "/apps/unsaved", { credential: acme })).status).toBe(404);
  });

  it("registers a second branch as a non-production branch of the same app", async () => {
    const r = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "node-web", repository: repos["node-web"]!.url, branch: "feature/x" } });
    expect(r.status).toBe(201);
    // The branch keeps the project's display name, as any version of it would.
    expect(r.body).toMatchObject({ app_name: "node-web", display_name: "Node Web", branch: "feature/x", is_production: false });
    const collide = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "node-web", repository: repos["node-web"]!.url, branch: "feature-x" } });
    expect(collide.status).toBe(409);
    expect(collide.body.detail).toMatchObject({ code: "branch_collides", with: "feature/x" });
    const branches = await call(api, "GET", "/apps/node-web/branches", { credential: acmeRead });
    expect(branches.body).toMatchObject({ app_name: "node-web", environment: "dev" });
    expect(branches.body.branches.map((b: { branch: string }) => b.branch)).toEqual(["main", "feature/x"]);
    expect(branches.body).not.toHaveProperty("production_branch");

    // next_branch previews a registration; the keys' presence is the feature flag.
    const preview = async (next: string) => (await call(api, "GET", `/apps/node-web/branches?next_branch=${encodeURIComponent(next)}`, { credential: acmeRead })).body;
    expect(await preview("release/1")).toMatchObject({
      next_branch_would_be_production: false,
      production_branch: "main",
      next_branch_copy_refusal: null,
      clone_components_available: { db: false, drives: false, buckets: false },
    });
    expect(await preview("feature-x")).toMatchObject({ next_branch_would_be_production: null, next_branch_copy_refusal: { code: "branch_collides" } });
    expect(await preview("main")).toMatchObject({ next_branch_would_be_production: null, next_branch_copy_refusal: { code: "app_exists" } });
    expect(await preview("bad..name")).toMatchObject({ next_branch_would_be_production: null, next_branch_copy_refusal: { code: "invalid_branch" } });
  });

  it("gives another group's same name a numeric suffix instead of revealing it", async () => {
    const r = await call(api, "POST", "/apps", { credential: globex, body: { app_name: "node-web", repository: "https://example.com/globex/web.git" } });
    expect(r.status).toBe(201);
    expect(r.body.app_name).toBe("node-web-2");
  });

  it("keeps each front door's address to one app: a name or branch that would share one is refused or suffixed", async () => {
    // acme's node-web branch feature/x is served at node-web-feature-x.
    const named = await call(api, "POST", "/apps", { credential: globex, body: { app_name: "node-web-feature-x", repository: "https://example.com/globex/nwfx.git" } });
    expect(named.status).toBe(201);
    expect(named.body.app_name).toBe("node-web-feature-x-2");
    expect((await call(api, "POST", "/apps", { credential: globex, body: { app_name: "spot-dev", repository: "https://example.com/globex/spot-dev.git" } })).status).toBe(201);
    expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: "spot", repository: "https://example.com/acme/spot.git" } })).status).toBe(201);
    const branch = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "spot", repository: "https://example.com/acme/spot.git", branch: "dev" } });
    expect(branch.status).toBe(409);
    expect(branch.body.detail).toMatchObject({ code: "host_label_taken", host_label: "spot-dev" });
    const preview = await call(api, "GET", "/apps/spot/branches?next_branch=dev", { credential: acme });
    expect(preview.body).toMatchObject({ next_branch_would_be_production: null, next_branch_copy_refusal: { code: "host_label_taken" } });
    expect((await call(api, "GET", "/apps/spot/branches", { credential: acme })).body.branches.map((b: { branch: string }) => b.branch)).toEqual(["main"]);
    for (const [credential, name] of [[globex, "node-web-feature-x-2"], [globex, "spot-dev"], [acme, "spot"]] as const) {
      expect((await call(api, "DELETE", `/apps/${name}`, { credential })).status).toBe(204);
    }
  });

  it("cuts a long name short for its suffix, past names that were cut the same way", async () => {
    const long = "l".repeat(63);
    const register = async (credential: string, app_name: string, repo: string) =>
      call(api, "POST", "/apps", { credential, body: { app_name, repository: `https://example.com/${repo}.git` } });
    expect((await register(acme, long, "long-1")).body.app_name).toBe(long);
    expect((await register(globex, `${"l".repeat(61)}-2`, "long-2")).body.app_name).toBe(`${"l".repeat(61)}-2`);
    const third = await register(globex, long, "long-3");
    expect(third.status).toBe(201);
    expect(third.body.app_name).toBe(`${"l".repeat(61)}-3`);
    for (const [credential, name] of [[acme, long], [globex, `${"l".repeat(61)}-2`], [globex, `${"l".repeat(61)}-3`]] as const) {
      expect((await call(api, "DELETE", `/apps/${name}`, { credential })).status).toBe(204);
    }
  });

  it("validates the body: 422 for a bad name, an unsupported repository host, a missing field", async () => {
    for (const body of [
      { app_name: "!!!", repository: "https://example.com/a.git" },
      { app_name: "x".repeat(129), repository: "https://example.com/a.git" },
      { app_name: "ok", repository: "ftp://example.com/a.git" },
      { app_name: "ok", repository: "https://example.com/a.git", config_path: "../x.yaml" },
      { app_name: "ok", repository: "https://example.com/a.git", branch: "a..b" },
      // An empty string is not "not given": each of these would otherwise fall back to its default.
      ...["branch", "config_path", "copy_vars_from_branch", "clone_data_from_branch", "seed_from_reference"].map((field) => ({
        app_name: "ok",
        repository: "https://example.com/a.git",
        [field]: "",
      })),
      { app_name: "ok" },
    ]) {
      const r = await call(api, "POST", "/apps", { credential: acme, body });
      expect(r.status, JSON.stringify(body)).toBe(422);
    }
    const unsupported = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "ok", repository: "ftp://example.com/a.git" } });
    expect(unsupported.body.detail.code).toBe("repository_host_unsupported");
    // What the agents would refuse before git is refused at registration, not left to the preflight.
    const option = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "ok", repository: "ssh://-oProxyCommand=touch%20/tmp/x/app" } });
    expect(option.body.detail.code).toBe("repository_host_unsupported");
    expect((await call(api, "POST", "/apps", { credential: acmeRead, body: { app_name: "ok", repository: "https://example.com/a.git" } })).status).toBe(403);
    expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: "ok", repository: "https://example.com/a.git", group_slug: "globex" } })).status).toBe(403);
    // Selectors that disagree are pointed out, not settled for the caller; nothing is written.
    const selectors = await call(api, "POST", "/apps?group=acme", { credential: fleet.rootKey, body: { app_name: "ok", repository: "https://example.com/a.git", group_slug: "globex" } });
    expect(selectors).toMatchObject({ status: 422, body: { detail: { code: "group_selectors_differ" } } });
    const alias = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "ok", repository: "https://example.com/a.git", group_slug: "acme", group: "globex" } });
    expect(alias).toMatchObject({ status: 422, body: { detail: { code: "group_selectors_differ" } } });
    expect((await call(api, "GET", "/apps/ok", { credential: fleet.rootKey })).status).toBe(404);
  });
});

describe("a repository URL with credentials", () => {
  it("clones with them, and shows them to nobody", async () => {
    const url = "https://x-access-token:ghp_not-shown@git.invalid/acme/private.git";
    const r = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "private", repository: url } });
    expect(r.status).toBe(201);
    expect(r.body.repository).toBe("https://***@git.invalid/acme/private.git");
    expect((await call(api, "GET", "/apps/private", { credential: acmeRead })).body.repository).toBe("https://***@git.invalid/acme/private.git");
    const listed = (await call(api, "GET", "/apps", { credential: fleet.rootKey })).body;
    expect(JSON.stringify(listed)).not.toContain("ghp_not-shown");
    const mismatch = await call(api, "POST", "/builds", { credential: acme, body: { app_name: "private", repository: "https://tok@git.invalid/acme/other.git" } });
    expect(mismatch.body.detail.code).toBe("repository_mismatch");
    expect(JSON.stringify(mismatch.body)).not.toContain("ghp_not-shown");
    expect(JSON.stringify(mismatch.body)).not.toContain("tok@");
    expect((await call(api, "DELETE", "/apps/private", { credential: acme })).status).toBe(204);
  });
});

describe("registration from another branch", () => {
  it("copies variables, refuses a data clone no agent can run (503) and checks a seed reference", async () => {
    const put = await call(api, "PUT", "/vars/node-web", { credential: acme, body: { branch: "main", variables: { API_URL: "https://x", MODE: "prod" } } });
    expect(put.status).toBe(200);
    const copy = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "node-web", repository: repos["node-web"]!.url, branch: "staging", copy_vars_from_branch: "main" } });
    expect(copy.status).toBe(201);
    expect(copy.body.copied_var_keys).toEqual(["API_URL", "MODE"]);
    expect((await call(api, "GET", "/vars/node-web?branch=staging", { credential: acme })).body.variables).toEqual({ API_URL: "https://x", MODE: "prod" });
    // A write names its branch in the body or, as GET reads it, in the query; never two different ones.
    expect((await call(api, "PUT", "/vars/node-web?branch=staging", { credential: acme, body: { variables: { ONLY_STAGING: "1" } } })).body.branch).toBe("staging");
    expect((await call(api, "GET", "/vars/node-web?branch=main", { credential: acme })).body.variables).not.toHaveProperty("ONLY_STAGING");
    expect((await call(api, "PUT", "/vars/node-web?branch=staging", { credential: acme, body: { branch: "main", variables: { X: "1" } } })).status).toBe(422);
    expect((await call(api, "DELETE", "/vars/node-web?branch=staging", { credential: acme, body: { key: "ONLY_STAGING" } })).body.variables).not.toHaveProperty("ONLY_STAGING");
    // An empty branch (a script's unset variable) is refused, never taken for main; spaces around one are not part of it.
    for (const write of [{ branch: "", variables: { X: "1" } }, { branch: "  ", variables: { X: "1" } }]) {
      expect(await call(api, "PUT", "/vars/node-web", { credential: acme, body: write })).toMatchObject({ status: 422, body: { detail: expect.stringContaining("branch is empty") } });
    }
    expect((await call(api, "PUT", "/vars/node-web?branch=", { credential: acme, body: { variables: { X: "1" } } })).status).toBe(422);
    expect((await call(api, "DELETE", "/vars/node-web", { credential: acme, body: { branch: "", key: "API_URL" } })).status).toBe(422);
    expect((await call(api, "GET", "/vars/node-web?branch=main", { credential: acme })).body.variables).toEqual({ API_URL: "https://x", MODE: "prod" });
    expect((await call(api, "PUT", "/vars/node-web?branch=staging", { credential: acme, body: { branch: " staging", variables: { SPACED: "1" } } })).body.branch).toBe("staging");

    // A data copy no agent can run is refused 503 once every other rule passed, and nothing is written: not the branch, not the
    // variables it would copy. Omitted entirely, the components are db plus drives; given in part, each missing key takes its default.
    const clone = await call(api, "POST", "/apps", {
      credential: acme,
      body: { app_name: "node-web", repository: repos["node-web"]!.url, branch: "qa", clone_data_from_branch: "main", copy_vars_from_branch: "main" },
    });
    expect(clone).toMatchObject({ status: 503, body: { detail: { code: "clone_data_unavailable", source_branch: "main", components: { db: true, drives: true, buckets: false } } } });
    expect((await call(api, "GET", "/apps/node-web?branch=qa", { credential: acme })).status).toBe(404);
    expect((await call(api, "GET", "/vars/node-web?branch=qa", { credential: acme })).status).toBe(404);
    const buckets = await call(api, "POST", "/apps", {
      credential: acme,
      body: { app_name: "node-web", repository: repos["node-web"]!.url, branch: "qa-buckets", clone_data_from_branch: "main", clone_components: { buckets: true } },
    });
    expect(buckets.body.detail).toMatchObject({ code: "clone_data_unavailable", components: { db: true, drives: false, buckets: true } });

    const refusals: Array<[Record<string, unknown>, number]> = [
      [{ app_name: "node-web", branch: "b1", clone_data_from_branch: "nope" }, 404],
      [{ app_name: "node-web", branch: "b2", copy_vars_from_branch: "nope" }, 404],
      [{ app_name: "node-web", branch: "b3", clone_data_from_branch: "main", seed_from_reference: "node-web:main:latest" }, 422],
      [{ app_name: "node-web", branch: "b4", seed_from_reference: "not a reference" }, 422],
      [{ app_name: "node-web", branch: "b5", seed_from_reference: "other-app:main:latest" }, 404],
      // A branch is not seeded from itself.
      [{ app_name: "node-web", branch: "b6", seed_from_reference: "node-web:b6:latest" }, 422],
      // A data copy of nothing.
      [{ app_name: "node-web", branch: "b7", clone_data_from_branch: "main", clone_components: { db: false, drives: false, buckets: false } }, 422],
      [{ app_name: "fresh-app", repository: "https://example.com/fresh.git", copy_vars_from_branch: "main" }, 422],
    ];
    for (const [body, status] of refusals) {
      const r = await call(api, "POST", "/apps", { credential: acme, body: { repository: repos["node-web"]!.url, ...body } });
      expect(r.status, JSON.stringify(body)).toBe(status);
    }
    // Nothing of a refused registration was written.
    const branches = await call(api, "GET", "/apps/node-web/branches", { credential: acme });
    expect(branches.body.branches.map((b: { branch: string }) => b.branch)).not.toContain("b1");
    expect(branches.body.branches.map((b: { branch: string }) => b.branch)).not.toContain("qa-buckets");
    for (const branch of ["staging"]) expect((await call(api, "DELETE", `/apps/node-web?branch=${branch}`, { credential: acme })).status).toBe(204);
  });
});

describe("preflight outcomes", () => {
  it.each([
    ["no-config", "needs_config", "config_missing"],
    ["invalid-config", "config_invalid", "config_invalid"],
  ] as const)("%s ends %s", async (fixture, status, reason) => {
    const r = await call(api, "POST", "/apps", { credential: acme, body: { app_name: fixture, repository: repos[fixture]!.url } });
    expect(r.status).toBe(201);
    await expect.poll(async () => (await preflightOf(acme, fixture)).preflight_status, { timeout: 30_000, interval: 250 }).toBe(status);
    const app = await preflightOf(acme, fixture);
    expect(app.preflight_result.reason).toBe(reason);
    if (status === "needs_config") expect(app.preflight_result.missing_paths).toEqual(["platform.yaml"]);
    if (status === "config_invalid") expect(app.preflight_result.errors.map((e: { path: string }) => e.path)).toEqual(expect.arrayContaining(["services.web.port"]));
  });

  it("ends no_access for a branch that does not exist, and recheck re-queues it", async () => {
    const r = await call(api, "POST", "/apps", { credential: acme, body: { app_name: "failing-build", repository: repos["failing-build"]!.url, branch: "nope" } });
    expect(r.status).toBe(201);
    await expect.poll(async () => (await preflightOf(acme, "failing-build", "nope")).preflight_status, { timeout: 30_000, interval: 250 }).toBe("no_access");
    expect((await preflightOf(acme, "failing-build", "nope")).preflight_result.reason).toBe("branch_not_found");
    const recheck = await call(api, "POST", "/apps/failing-build/preflight/recheck?branch=nope", { credential: acme });
    expect(recheck.status).toBe(202);
    expect(recheck.body).toMatchObject({ app_name: "failing-build", branch: "nope", preflight_status: "pending", preflight_action_id: expect.any(String) });
    await expect.poll(async () => (await preflightOf(acme, "failing-build", "nope")).preflight_status, { timeout: 30_000, interval: 250 }).toBe("no_access");
  });

  it("lets a platform operator exempt an app from preflight, and lift the exemption; a tenant's exempt is 403", async () => {
    const path = "/apps/failing-build/preflight/recheck?branch=nope";
    const tenant = await call(api, "POST", path, { credential: acme, body: { exempt: true } });
    expect(tenant.status).toBe(403);
    expect((await preflightOf(acme, "failing-build", "nope")).preflight_status).toBe("no_access");
    const deployQuarantined = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: "failing-build", branch: "nope" } });
    expect(deployQuarantined.status).toBe(409);

    const exempt = await call(api, "POST", `${path}&group=acme`, { credential: fleet.rootKey, body: { exempt: true } });
    expect(exempt.status).toBe(202);
    expect(exempt.body).toMatchObject({ preflight_status: "exempt", preflight_action_id: expect.any(String) });
    // The check runs and answers no_access again; the app stays exempt, and deploys pass the gate
    // (this one then finds no build to deploy).
    await new Promise((r) => setTimeout(r, 3000));
    expect((await preflightOf(acme, "failing-build", "nope")).preflight_status).toBe("exempt");
    const deploy = await call(api, "POST", "/deployments", { credential: acme, body: { app_name: "failing-build", branch: "nope" } });
    expect(deploy.status).toBe(400);

    const lifted = await call(api, "POST", `${path}&group=acme`, { credential: fleet.rootKey, body: { exempt: false } });
    expect(lifted.body).toMatchObject({ preflight_status: "pending" });
    await expect.poll(async () => (await preflightOf(acme, "failing-build", "nope")).preflight_status, { timeout: 30_000, interval: 250 }).toBe("no_access");
    expect((await call(api, "POST", path, { credential: acme, body: { exempt: "yes" } })).status).toBe(422);
  });
});

describe("tenant isolation", () => {
  it("answers 404 for another group's app on every app route", async () => {
    const unknown = await call(api, "GET", "/apps/does-not-exist", { credential: globex });
    expect(unknown.status).toBe(404);
    for (const [method, path] of [
      ["GET", "/apps/node-web"],
      ["GET", "/apps/node-web/branches"],
      ["POST", "/apps/node-web/preflight/recheck"],
      ["DELETE", "/apps/node-web?branch=main"],
    ] as const) {
      const r = await call(api, method, path, { credential: globex });
      expect(r.status, `${method} ${path}`).toBe(404);
    }
    const list = await call(api, "GET", "/apps", { credential: globex });
    expect(list.body.items.map((a: { app_name: string }) => a.app_name)).toEqual(["node-web-2"]);
    expect(list.body).toMatchObject({ total: 1, domain: "dev.localhost" });
  });

  it("lets operators list every group's apps and select one group", async () => {
    const all = await call(api, "GET", "/apps", { credential: fleet.rootKey });
    expect(new Set(all.body.items.map((a: { group_slug: string }) => a.group_slug))).toEqual(new Set(["acme", "globex"]));
    const one = await call(api, "GET", "/apps?group=globex", { credential: fleet.rootKey });
    expect(one.body.items.every((a: { group_slug: string }) => a.group_slug === "globex")).toBe(true);
    // An app is looked up in the group named, never found (nor written) in another one.
    expect((await call(api, "GET", "/apps/node-web", { credential: fleet.rootKey })).body.group_slug).toBe("acme");
    expect((await call(api, "GET", "/apps/node-web?group=globex", { credential: fleet.rootKey })).status).toBe(404);
    const write = await call(api, "PUT", "/vars/node-web?group=globex", { credential: fleet.rootKey, body: { variables: { FROM_OPERATOR: "1" } } });
    expect(write.status).toBe(404);
    expect((await call(api, "GET", "/vars/node-web", { credential: acme })).body.variables).not.toHaveProperty("FROM_OPERATOR");
  });

  it("deletes a branch; the production branch of a multi-branch app must hand over first", async () => {
    const prod = await call(api, "DELETE", "/apps/node-web?branch=main", { credential: acme });
    expect(prod.status).toBe(409);
    expect(prod.body.detail.code).toBe("production_branch");
    expect((await call(api, "DELETE", "/apps/node-web", { credential: acme })).body.detail.code).toBe("branch_required");
    expect((await call(api, "DELETE", `/apps/node-web?branch=${encodeURIComponent("feature/x")}`, { credential: acme })).status).toBe(204);
    expect((await call(api, "GET", `/apps/node-web?branch=${encodeURIComponent("feature/x")}`, { credential: acme })).status).toBe(404);
  });

  it("never leaves an app without a production branch when a deletion races a promotion or a registration", async () => {
    const branchesOf = async (app: string) =>
      (await call(api, "GET", `/apps/${app}/branches`, { credential: acme })).body.branches.map((b: { branch: string; is_production: boolean }) => `${b.branch}${b.is_production ? "*" : ""}`);
    for (let i = 0; i < 6; i++) {
      const body = { app_name: `race-${i}`, repository: `https://example.com/acme/race-${i}.git` };
      expect((await call(api, "POST", "/apps", { credential: acme, body })).status).toBe(201);
      expect((await call(api, "POST", "/apps", { credential: acme, body: { ...body, branch: "dev" } })).status).toBe(201);
      // Promoted then deleted: 409 production_branch. Deleted then promoted: 404, main stays production.
      const [promote, remove] = await Promise.all([
        call(api, "POST", `/apps/race-${i}/set-production?branch=dev`, { credential: acme }),
        call(api, "DELETE", `/apps/race-${i}?branch=dev`, { credential: acme }),
      ]);
      expect([`${promote.status} ${remove.status}`, await branchesOf(`race-${i}`)]).toBeOneOf([
        ["200 409", ["dev*", "main"]],
        ["404 204", ["main*"]],
      ]);
      // Registered then deleted: 409 production_branch. Deleted then registered: the new branch is production.
      const staging = await Promise.all([
        call(api, "POST", "/apps", { credential: acme, body: { ...body, branch: "staging" } }),
        call(api, "DELETE", `/apps/race-${i}?branch=${(await branchesOf(`race-${i}`)).length === 1 ? "main" : "dev"}`, { credential: acme }),
      ]);
      expect((await branchesOf(`race-${i}`)).filter((b: string) => b.endsWith("*")), JSON.stringify(staging.map((r) => r.status))).toHaveLength(1);
    }
  });
});
