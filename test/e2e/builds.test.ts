/**
 * Builds through HTTP only (spec doc 1 sections 2.2, 2.3, 3.1, 4.3, 4.5 queue routes, 4.6):
 * a real agent clones the fixture repository with git, runs its build command and keeps the
 * image; the tenant watches the queue and reads the log. The agent also clones from git hosts
 * on loopback over HTTPS and SSH, trusting them as an operator configures an agent's git
 * (GIT_SSL_CAINFO, GIT_SSH_COMMAND). A second fleet without an agent shows the cancel of a queued
 * build cascading to its deploy.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { makeFixtureRepo, webConfigBuiltBy, type FixtureRepo } from "../fixtures/git.ts";
import { gitHttpsUnavailable, gitSshUnavailable, serveGitOverHttps, serveGitOverSsh, type GitHttpsServer, type GitSshServer } from "../fixtures/git-servers.ts";
import { call, waitFor } from "./support.ts";

let fleet: TestFleet;
let api: string;
let acme: string;
let globex: string;
let web: FixtureRepo;
let failing: FixtureRepo;
const noHttps = gitHttpsUnavailable();
const noSsh = gitSshUnavailable();
let https: GitHttpsServer | undefined;
let ssh: GitSshServer | undefined;

async function key(f: TestFleet, group: string, scope = "admin") {
  await call(f.api, "POST", "/groups", { credential: f.rootKey, body: { slug: group } });
  return (await call(f.api, "POST", "/keys", { credential: f.rootKey, body: { name: group, scope, group } })).body.key as string;
}

async function untilFinished(credential: string, buildId: string) {
  await expect
    .poll(async () => (await call(api, "GET", `/builds/id/${buildId}`, { credential })).body.status, { timeout: 90_000, interval: 500 })
    .toMatch(/^(completed|failed|cancelled)$/);
  return (await call(api, "GET", `/builds/id/${buildId}`, { credential })).body;
}

beforeAll(async () => {
  https = noHttps ? undefined : await serveGitOverHttps();
  ssh = noSsh ? undefined : await serveGitOverSsh();
  fleet = await startTestFleet({ env: { GIT_SSL_CAINFO: https?.caFile, GIT_SSH_COMMAND: ssh?.sshCommand } });
  api = fleet.api;
  acme = await key(fleet, "acme");
  globex = await key(fleet, "globex");
  web = await makeFixtureRepo("node-web");
  failing = await makeFixtureRepo("failing-build");
  for (const [name, repo] of [["node-web", web], ["failing-build", failing]] as const) {
    expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: name, repository: repo.url } })).status).toBe(201);
    await waitFor(async () => (await call(api, "GET", `/apps/${name}`, { credential: acme })).body.preflight_status, (s) => s === "ready");
  }
});

afterAll(async () => {
  await fleet?.stop();
  await https?.stop();
  await ssh?.stop();
  await web?.cleanup();
  await failing?.cleanup();
});

describe("a build on a real agent", () => {
  let buildId: string;
  let tag: string;

  it("is accepted with 202, its tag and action id", async () => {
    const r = await call(api, "POST", "/builds", { credential: acme, body: { app_name: "node-web", repository: web.url, auto_deploy: false } });
    expect(r.status).toBe(202);
    expect(r.body).toEqual({ tag: expect.stringMatching(/^main-[0-9a-f]{8}$/), action_id: r.body.build_id, status: "queued", build_id: expect.any(String), app_name: "node-web" });
    ({ build_id: buildId, tag } = r.body);
    const app = await call(api, "GET", "/apps/node-web", { credential: acme });
    expect(app.body.build_count).toBe(1);
  });

  it("shows in the queue and completes with the commit it built", async () => {
    // The queue row follows the build through the outbox, a moment after the 202.
    await expect
      .poll(async () => (await call(api, "GET", "/deployments/queue?all=true", { credential: acme })).body.map((a: { action_id: string }) => a.action_id), { timeout: 10_000 })
      .toContain(buildId);
    const build = await untilFinished(acme, buildId);
    expect(build).toMatchObject({
      id: buildId,
      app_name: "node-web",
      tag,
      status: "completed",
      queue_status: "build_completed",
      commit_hash: web.head,
      commit_author: expect.stringContaining("Platform Fixtures"),
      codebuild_phase: "COMPLETED",
      error_message: null,
    });
    expect(build.images).toEqual([expect.stringContaining(`node-web:${tag}`)]);
    expect(build.duration_seconds).toBeGreaterThanOrEqual(0);
    const app = await call(api, "GET", "/apps/node-web", { credential: acme });
    expect(app.body.latest_build).toBe(tag);
  });

  it("keeps the build output as its log, and ships the lines to the log store", async () => {
    const logs = await call(api, "GET", `/builds/id/${buildId.slice(0, 8)}/logs`, { credential: acme });
    expect(logs.status).toBe(200);
    expect(logs.body).toMatchObject({ build_id: buildId, app_name: "node-web", tag, status: "completed" });
    expect(logs.body.log).toContain("build: wrote dist/build-info.txt");
    expect(logs.body.lines).toBeGreaterThan(2);
    // The lines reach the log store in batches, in order, a moment after the build: its last line
    // there means all of them are (the next test counts them).
    await expect
      .poll(async () => (await call(api, "GET", `/logs?build_id=${buildId}&source=build&limit=1000`, { credential: acme })).body.logs?.map((l: { message: string }) => l.message) ?? [], { timeout: 15_000 })
      .toContainEqual(expect.stringContaining("published to the fleet's image store"));
    await expect
      .poll(async () => (await call(api, "GET", `/logs?app_name=node-web&source=build&search=wrote`, { credential: acme })).body.logs.some((l: { message: string }) => l.message.includes("wrote")), {
        timeout: 15_000,
      })
      .toBe(true);
  });

  it("reads an app's log lines under any branch the app has: branch scopes the access check only", async () => {
    // dev has no line of its own yet: the app's lines still come back under it.
    expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: "node-web", repository: web.url, branch: "dev" } })).status).toBe(201);
    const all = (await call(api, "GET", "/logs?app_name=node-web&source=build&limit=1000", { credential: acme })).body;
    expect(all.total).toBeGreaterThan(0);
    for (const branch of ["main", "dev"]) {
      expect((await call(api, "GET", `/logs?app_name=node-web&source=build&limit=1000&branch=${branch}`, { credential: acme })).body.total, branch).toBe(all.total);
    }
    // A branch the app lacks, or an app of another group, reads like an unknown app.
    expect((await call(api, "GET", "/logs?app_name=node-web&source=build&branch=nope", { credential: acme })).body).toEqual({ logs: [], total: 0, has_more: false });
    expect((await call(api, "GET", "/logs?app_name=node-web&source=build&branch=main", { credential: globex })).body).toEqual({ logs: [], total: 0, has_more: false });
    // The parameters are checked all the same.
    expect((await call(api, "GET", "/logs?app_name=node-web&branch=nope&limit=5000", { credential: acme })).status).toBe(422);
  });

  it("is found by id prefix and by tag, and listed with filters", async () => {
    expect((await call(api, "GET", `/builds/node-web/${tag}`, { credential: acme })).body.id).toBe(buildId);
    // The name as written finds the build by tag, as it finds the list.
    expect((await call(api, "GET", `/builds/${encodeURIComponent("Node Web")}/${tag}`, { credential: acme })).body.id).toBe(buildId);
    const list = await call(api, "GET", "/builds?app_name=node-web&limit=1", { credential: acme });
    expect(list.body).toMatchObject({ total: 1, items: [expect.objectContaining({ id: buildId })] });
    const byWrittenName = await call(api, "GET", `/builds?app_name=${encodeURIComponent("Node Web")}&limit=1`, { credential: acme });
    expect(byWrittenName.body.items[0]?.id).toBe(buildId);
    expect((await call(api, "GET", "/builds?limit=0", { credential: acme })).status).toBe(422);
    expect((await call(api, "POST", "/builds", { credential: acme, body: { app_name: "node-web", branch: "" } })).status).toBe(422);
    expect((await call(api, "GET", "/builds?limit=201", { credential: acme })).status).toBe(422);
    expect((await call(api, "GET", `/builds/id/${buildId.slice(0, 7)}`, { credential: acme })).status).toBe(422);
    expect((await call(api, "GET", "/builds/id/zzzzzzzz", { credential: acme })).status).toBe(422);
    // However long, an id reaches its route, which says what is wrong with it.
    const long = await call(api, "GET", `/builds/id/${"a".repeat(101)}`, { credential: acme });
    expect(long).toMatchObject({ status: 422, body: { detail: expect.stringContaining("at most 36 characters") } });
    expect((await call(api, "GET", `/apps/${"a".repeat(129)}`, { credential: acme })).status).toBe(404);
    expect(await call(api, "GET", `/logs?deployment_id=${"a".repeat(65)}`, { credential: acme })).toMatchObject({
      status: 422,
      body: { detail: expect.stringContaining("is not a deployment id: an id has at most 36 characters") },
    });
  });

  it("answers 404, never 403, to another group on every build route", async () => {
    for (const path of [`/builds/id/${buildId}`, `/builds/id/${buildId}/logs`, `/builds/node-web/${tag}`, `/deployments/queue/${buildId}`, `/deployments/queue/${buildId}/diagnose`]) {
      expect((await call(api, "GET", path, { credential: globex })).status, path).toBe(404);
    }
    expect((await call(api, "GET", "/builds?app_name=node-web", { credential: globex })).body).toEqual({ items: [], total: 0 });
    expect((await call(api, "GET", `/logs?build_id=${buildId}`, { credential: globex })).body.logs).toEqual([]);
  });

  it("names the app it built: another group's build of a taken name builds its own suffixed app", async () => {
    const body = { app_name: "node-web", repository: failing.url, auto_deploy: false };
    const first = await call(api, "POST", "/builds?skip_preflight=true", { credential: globex, body });
    expect(first).toMatchObject({ status: 202, body: { app_name: "node-web-2" } });
    const again = await call(api, "POST", "/builds?skip_preflight=true", { credential: globex, body });
    expect(again).toMatchObject({ status: 202, body: { app_name: "node-web-2" } });
    expect((await call(api, "GET", `/builds/node-web-2/${again.body.tag}`, { credential: globex })).body.id).toBe(again.body.build_id);
  });

  it("a failing build ends failed with a useful error and its output; its deploy cannot be retried", async () => {
    const r = await call(api, "POST", "/builds", { credential: acme, body: { app_name: "failing-build", repository: failing.url, auto_deploy: true } });
    const build = await untilFinished(acme, r.body.build_id);
    expect(build.status).toBe("failed");
    expect(build.error_message).toMatch(/exited with code 1/);
    const logs = await call(api, "GET", `/builds/id/${r.body.build_id}/logs`, { credential: acme });
    expect(logs.body.status).toBe("failed");
    expect(logs.body.log.length).toBeGreaterThan(0);
    await waitFor(async () => (await call(api, "GET", "/deployments?app_name=failing-build", { credential: acme })).body.items, (items) => items[0]?.status === "failed", 30_000);
    const retry = await call(api, "POST", "/apps/failing-build/retry", { credential: acme });
    expect(retry).toMatchObject({ status: 409, body: { detail: { code: "build_not_completed", build_id: r.body.build_id } } });
  });

  it("completes a build whose log is larger than one bus message, and the builds after it", async () => {
    const chatty = await makeFixtureRepo("node-web", {
      files: {
        "chatty.js": 'for (let i = 0; i < 30000; i++) console.log(`${i} ${"x".repeat(80)}`);',
        "platform.yaml": webConfigBuiltBy("node chatty.js"),
      },
    });
    try {
      const r = await call(api, "POST", "/builds?skip_preflight=true", { credential: acme, body: { app_name: "chatty", repository: chatty.url, auto_deploy: false } });
      expect(r.status).toBe(202);
      const build = await untilFinished(acme, r.body.build_id);
      expect(build).toMatchObject({ status: "completed", queue_status: "build_completed" });
      const logs = await call(api, "GET", `/builds/id/${r.body.build_id}/logs`, { credential: acme });
      expect(logs.body).toMatchObject({ status: "completed", build_id: r.body.build_id });
      // The stored log keeps the first and the last output, and says what it left out between.
      expect(logs.body.log).toContain("[web] 0 xxxx");
      expect(logs.body.log).toMatch(/\n\[\d+ line\(s\), \d+ characters, left out here: the log keeps a build's first and last output\]\n/);
      expect(logs.body.log).toContain("[web] 29999 xxxx");
      // The log store got the lines the log rate limit lets through (a minute's worth at once, 6000
      // by default, none lost while the command waited for room in the agent's buffer), then a
      // line saying how many it held back.
      const found = async (search: string) => (await call(api, "GET", `/logs?build_id=${r.body.build_id}&search=${search}&since=1h`, { credential: acme })).body;
      const notice = await waitFor(() => found("shipped"), (b) => b.total > 0, 30_000);
      expect(notice.logs[0].message).toMatch(/^\[\d+ line\(s\) of this build's output not shipped since \S+: a build may log 6000 lines a minute; the build's own log keeps its first and last output\]$/);
      for (const n of [0, 1234, 4321, 5999]) expect((await found(String(n))).total, String(n)).toBe(1);
      const next = await call(api, "POST", "/builds", { credential: acme, body: { app_name: "node-web", repository: web.url, auto_deploy: false } });
      expect((await untilFinished(acme, next.body.build_id)).status).toBe("completed");
    } finally {
      await chatty.cleanup();
    }
  });

  it("stops a running build's command when it is cancelled, instead of letting it run to its end", async () => {
    const slow = await makeFixtureRepo("node-web", { files: { "platform.yaml": webConfigBuiltBy("sleep 120") } });
    try {
      const r = await call(api, "POST", "/builds?skip_preflight=true", { credential: acme, body: { app_name: "cancelled-build", repository: slow.url, auto_deploy: false } });
      expect(r.status).toBe(202);
      await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${r.body.action_id}`, { credential: acme })).body.phase, { timeout: 60_000 }).toBe("build:web");
      expect((await call(api, "POST", `/deployments/${r.body.build_id}/cancel`, { credential: acme })).body.status).toBe("cancel_requested");
      const asked = Date.now();
      const build = await untilFinished(acme, r.body.build_id);
      expect(build.status).toBe("cancelled");
      await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${r.body.action_id}`, { credential: acme })).body.error_message, { timeout: 10_000 }).toBe("Cancelled during build:web.");
      // The agent hears of it within a couple of its 2 s reports, not after the command's 120 s.
      expect(Date.now() - asked).toBeLessThan(30_000);
    } finally {
      await slow.cleanup();
    }
  });

  it("shows the commit of a running build, and runs a build again from the clone when its agent restarted during it, saying why in its log", async () => {
    const slow = await makeFixtureRepo("node-web", { files: { "build.js": "setTimeout(() => console.log('slow build done'), 4000);\n" } });
    try {
      const r = await call(api, "POST", "/builds?skip_preflight=true", { credential: acme, body: { app_name: "slow-build", repository: slow.url, auto_deploy: false } });
      expect(r.status).toBe(202);
      await expect.poll(async () => (await call(api, "GET", `/deployments/queue/${r.body.action_id}`, { credential: acme })).body.phase, { timeout: 60_000 }).toBe("build:web");
      // While it runs, the queue and the builds row already show the commit it builds.
      expect((await call(api, "GET", `/deployments/queue/${r.body.action_id}`, { credential: acme })).body.commit_author).toContain("Platform Fixtures");
      await expect
        .poll(async () => (await call(api, "GET", `/builds/id/${r.body.build_id}`, { credential: acme })).body, { timeout: 10_000 })
        .toMatchObject({ status: "queued", commit_hash: slow.head, commit_author: expect.stringContaining("Platform Fixtures") });
      await fleet.restart("agent");
      const build = await untilFinished(acme, r.body.build_id);
      expect(build.status).toBe("completed");
      const { log } = (await call(api, "GET", `/builds/id/${r.body.build_id}/logs`, { credential: acme })).body;
      expect(log).toMatch(/^The agent on host \S+ restarted while this build ran; the build starts again from the clone\./);
      expect(log.match(/slow build done/g)).toHaveLength(1);
    } finally {
      await slow.cleanup();
    }
  });

  it("forgets a deleted app's build lines: registered again, it starts without them", async () => {
    const doomed = await makeFixtureRepo("node-web");
    try {
      const r = await call(api, "POST", "/builds?skip_preflight=true", { credential: acme, body: { app_name: "doomed", repository: doomed.url, auto_deploy: false } });
      expect((await untilFinished(acme, r.body.build_id)).status).toBe("completed");
      const lines = async () => (await call(api, "GET", `/logs?app_name=doomed&source=build`, { credential: acme })).body;
      // Every line stored (the last one is): a line still on its way when the app is deleted would be stored after it.
      await expect
        .poll(async () => (await lines()).logs.map((l: { message: string }) => l.message), { timeout: 30_000 })
        .toContainEqual(expect.stringContaining("published to the fleet's image store"));
      expect((await call(api, "DELETE", "/apps/doomed", { credential: acme })).status).toBe(204);
      await expect.poll(async () => (await call(api, "GET", `/logs?build_id=${r.body.build_id}`, { credential: acme })).body.total, { timeout: 30_000 }).toBe(0);
      expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: "doomed", repository: doomed.url } })).status).toBe(201);
      expect(await lines()).toMatchObject({ logs: [], total: 0 });
    } finally {
      await doomed.cleanup();
    }
  });

  it("refuses a quarantined app with 409 and remediation text, unless preflight is skipped", async () => {
    const r = await call(api, "POST", "/builds", { credential: acme, body: { app_name: "brand-new", repository: "https://example.invalid/x.git" } });
    expect(r.status).toBe(409);
    expect(r.body.detail).toMatchObject({ code: "preflight_quarantined", message: expect.stringContaining("preflight") });
    const skipped = await call(api, "POST", "/builds?skip_preflight=true", { credential: acme, body: { app_name: "brand-new", repository: "https://example.invalid/x.git", auto_deploy: false } });
    expect(skipped.status).toBe(202);
    // Retry is refused for the quarantine first, though nothing was ever deployed.
    const retry = await call(api, "POST", "/apps/brand-new/retry", { credential: acme });
    expect(retry).toMatchObject({ status: 409, body: { detail: { code: "preflight_quarantined", message: expect.stringContaining("preflight") } } });
    expect((await call(api, "POST", "/apps/brand-new/retry", { credential: acme, body: { now: true } })).status).toBe(422);
  });

  it("builds a registered app with its own config path: another one sent is 409, a bad one 422", async () => {
    const build = (config_path: string) => call(api, "POST", "/builds", { credential: acme, body: { app_name: "node-web", repository: web.url, auto_deploy: false, config_path } });
    const other = await build("web/platform.yaml");
    expect(other).toMatchObject({ status: 409, body: { detail: { code: "config_path_mismatch", config_path: "platform.yaml" } } });
    expect((await build("/etc/passwd")).status).toBe(422);
    expect((await build("./platform.yaml")).status).toBe(202);
  });
});

describe("repositories on git hosts", () => {
  /** Registers an app from `repository`, waits for its preflight, builds it: the finished build. */
  async function registerAndBuild(app: string, repository: string) {
    expect((await call(api, "POST", "/apps", { credential: acme, body: { app_name: app, repository } })).status).toBe(201);
    const preflight = await waitFor(async () => (await call(api, "GET", `/apps/${app}`, { credential: acme })).body.preflight_status, (s) => s !== "pending");
    expect(preflight).toBe("ready");
    const r = await call(api, "POST", "/builds", { credential: acme, body: { app_name: app, repository, auto_deploy: false } });
    expect(r.status).toBe(202);
    return untilFinished(acme, r.body.build_id);
  }

  const hosts = [
    { protocol: "HTTPS", app: "web-https", unavailable: noHttps, url: (fileUrl: string) => https!.url(fileUrl) },
    { protocol: "SSH", app: "web-ssh", unavailable: noSsh, url: (fileUrl: string) => ssh!.url(fileUrl) },
  ];
  for (const host of hosts) {
    it.skipIf(host.unavailable !== null)(`registers, preflights and builds an app from an ${host.protocol} repository${host.unavailable ? ` (skipped: ${host.unavailable})` : ""}`, async () => {
      const repo = await makeFixtureRepo("node-web");
      try {
        const build = await registerAndBuild(host.app, host.url(repo.url));
        expect(build, build.error_message).toMatchObject({ status: "completed", commit_hash: repo.head });
      } finally {
        await repo.cleanup();
      }
    });
  }
});

describe("without an agent: builds stay queued", () => {
  let idle: TestFleet;

  beforeAll(async () => {
    idle = await startTestFleet({ agent: false });
  });

  afterAll(async () => {
    await idle?.stop();
  });

  it("takes the first builds of a new app sent together: one registers it, every one is built", async () => {
    const k = await key(idle, "initech");
    const body = { app_name: "together", repository: "https://example.com/together.git", auto_deploy: false };
    const sent = await Promise.all(Array.from({ length: 8 }, () => call(idle.api, "POST", "/builds?skip_preflight=true", { credential: k, body })));
    expect(sent.map((r) => r.status)).toEqual(Array(8).fill(202));
    const listed = await call(idle.api, "GET", "/builds?app_name=together", { credential: k });
    expect(listed.body.items.map((b: { id: string }) => b.id).sort()).toEqual(sent.map((r) => r.body.build_id).sort());
    expect((await call(idle.api, "GET", "/apps/together", { credential: k })).body.build_count).toBe(8);

    // Without skip_preflight, each is refused as the new app is quarantined, none as a name clash.
    const held = await Promise.all(
      Array.from({ length: 8 }, () => call(idle.api, "POST", "/builds", { credential: k, body: { ...body, app_name: "held", repository: "https://example.com/held.git" } })),
    );
    expect(held.map((r) => `${r.status} ${r.body.detail.code}`)).toEqual(Array(8).fill("409 preflight_quarantined"));
  });

  it("cancels a queued build and its dependent deploy", async () => {
    const k = await key(idle, "acme");
    const r = await call(idle.api, "POST", "/builds?skip_preflight=true", { credential: k, body: { app_name: "queued", repository: "https://example.com/q.git" } });
    expect(r.status).toBe(202);
    // Without an agent, the app's preflight stays queued beside the two.
    await expect
      .poll(async () => (await call(idle.api, "GET", "/deployments/queue", { credential: k })).body.map((a: { action_type: string }) => a.action_type).sort(), { timeout: 15_000 })
      .toEqual(["BUILD", "DEPLOY", "GIT_PREFLIGHT"]);
    const cancel = await call(idle.api, "POST", `/deployments/${r.body.build_id}/cancel`, { credential: k, body: { reason: "changed my mind" } });
    expect(cancel.status).toBe(200);
    expect(cancel.body).toMatchObject({ status: "cancelled", cancelled: true, cancel_requested: false, app_name: "queued" });
    expect(cancel.body.dependents_cancelled).toHaveLength(1);
    const again = await call(idle.api, "POST", `/deployments/${r.body.build_id}/cancel`, { credential: k });
    expect(again.body.status).toBe("not_cancellable");
    await expect.poll(async () => (await call(idle.api, "GET", `/builds/id/${r.body.build_id}`, { credential: k })).body.status, { timeout: 15_000 }).toBe("cancelled");
    const queue = await call(idle.api, "GET", "/deployments/queue?all=true&exclude_types=GIT_PREFLIGHT", { credential: k });
    expect(queue.body.map((a: { status: string }) => a.status)).toEqual(["cancelled", "cancelled"]);
  });

  it("clamps admit-force's ttl_seconds to 60-3600, however large the number sent", async () => {
    const k = await key(idle, "acme");
    const r = await call(idle.api, "POST", "/builds?skip_preflight=true", { credential: k, body: { app_name: "forced", repository: "https://example.com/forced.git", auto_deploy: false } });
    await expect.poll(async () => (await call(idle.api, "GET", `/deployments/queue/${r.body.build_id}`, { credential: k })).status, { timeout: 15_000 }).toBe(200);
    const force = (ttl: unknown) => call(idle.api, "POST", `/deployments/queue/${r.body.build_id}/admit-force`, { credential: k, body: { reason: "hotfix", ttl_seconds: ttl } });
    for (const [sent, clamped] of [[5, 60], [2_147_483_648, 3600], [1e10, 3600], [-5, 60]] as const) {
      expect(await force(sent)).toMatchObject({ status: 200, body: { ttl_seconds: clamped, single_use: true } });
    }
    expect((await force("long")).status).toBe(422);
  });

  it("answers GET /api/logs with empty logs and an error while the log store does not answer, and 422 stays 422", async () => {
    const k = await key(idle, "acme");
    const logs = idle.processes.find((p) => p.name === "health-aggregator")!;
    process.kill(logs.pid!, "SIGSTOP");
    try {
      const r = await call(idle.api, "GET", "/logs?source=agent", { credential: k });
      expect(r).toMatchObject({ status: 200, body: { logs: [], total: 0, has_more: false, error: "The log store did not answer in time; try again in a moment." } });
    } finally {
      process.kill(logs.pid!, "SIGCONT");
    }
    expect((await call(idle.api, "GET", "/logs?source=agent", { credential: k })).body).not.toHaveProperty("error");
    expect((await call(idle.api, "GET", "/logs?level=loud", { credential: k })).status).toBe(422);
  });

  it("cancels a build sent the moment its 202 comes, before the queue has taken it in", async () => {
    const k = await key(idle, "acme");
    for (let i = 0; i < 6; i++) {
      const r = await call(idle.api, "POST", "/builds?skip_preflight=true", { credential: k, body: { app_name: "hasty", repository: "https://example.com/hasty.git" } });
      expect(r.status).toBe(202);
      const cancel = await call(idle.api, "POST", `/deployments/${r.body.build_id}/cancel`, { credential: k });
      expect(cancel.body).toMatchObject({ deployment_id: r.body.build_id, status: "cancelled", cancelled: true, app_name: "hasty" });
      expect(cancel.body.dependents_cancelled).toHaveLength(1);
      await expect.poll(async () => (await call(idle.api, "GET", `/builds/id/${r.body.build_id}`, { credential: k })).body.status, { timeout: 15_000 }).toBe("cancelled");
      const [deploy] = cancel.body.dependents_cancelled as string[];
      // The build's own event reaches the queue afterwards and adds nothing: both stay cancelled.
      const actions = (await call(idle.api, "GET", "/deployments/queue?all=true", { credential: k })).body.filter((a: { action_id: string }) => [r.body.build_id, deploy].includes(a.action_id));
      expect(actions.map((a: { action_type: string; status: string }) => `${a.action_type} ${a.status}`).sort()).toEqual(["BUILD cancelled", "DEPLOY cancelled"]);
    }
  });
});
