/**
 * Time to a live release (issue: deployments, item 9a): from `POST /api/builds` with auto-deploy
 * to the first HTTP 200 of the new release through the router, for the node-web fixture, against
 * a baseline script doing the same steps by hand in the same run: a shallow clone of the branch,
 * `node build.js`, `node server.js` on a free port, polled until it answers 200. Target: at most
 * 1.5 times the baseline (median of BENCH_DEPLOY_RUNS runs of each side, default 3, after one
 * warm-up run of each side that is not counted).
 *
 * One fleet serves the whole benchmark. The app is registered (and its preflight is `ready`)
 * before anything is timed. Each run commits a new version of the fixture whose answer carries a
 * marker (`hello from node-web bench-<n> (/)`), so every platform run is a real new build and
 * blue/green deploy, and "first 200" means the first 200 of that release (the older one keeps
 * answering 200 until the swap). The baseline serves the same commit. Both sides poll every
 * 50 ms. The two sides alternate (which goes first alternates too); each platform run waits for
 * its deploy to be terminal (drain included) before the next timed run.
 *
 * For every platform run the time is broken down from the platform's own timestamps: queue wait
 * (POST to build started), build (clone, build command, packaging), hand-off (build completed to
 * deploy claimed), deploy until the first 200 (and per deploy phase, from the deploy log's
 * timestamps), and when the deploy completed.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import http from "node:http";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { freePort, startTestFleet, type TestFleet } from "@platform/testing";
import { makeFixtureRepo, type FixtureRepo } from "../fixtures/git.ts";
import { call, waitFor, type Verdict } from "./lib.ts";

const RUNS = Number(process.env.BENCH_DEPLOY_RUNS ?? 3);
const TARGET = 1.5;
const APP = "node-web";
const POLL_MS = 50;
const RUN_TIMEOUT_MS = 180_000;

const execFileAsync = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const seconds = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

/** One GET on a new connection; null when nothing answers (yet). */
function get(port: number, urlPath: string, host?: string): Promise<{ status: number; body: string } | null> {
  return new Promise((resolve) => {
    const req = http.get({ host: "127.0.0.1", port, path: urlPath, headers: host ? { host } : {}, agent: false, timeout: 2000 }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      res.on("error", () => resolve(null));
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", () => resolve(null));
  });
}

/** Polls GET / every POLL_MS until it answers 200 with `marker`; `check` may throw to give up early. */
async function firstOk(port: number, marker: string, host: string | undefined, check?: () => Promise<void>): Promise<void> {
  const until = Date.now() + RUN_TIMEOUT_MS;
  let lastCheck = Date.now();
  let last: unknown = null;
  for (;;) {
    const r = await get(port, "/", host);
    if (r && r.status === 200 && r.body.startsWith(marker)) return;
    last = r;
    if (Date.now() > until) throw new Error(`no 200 with '${marker}' on port ${port} within ${RUN_TIMEOUT_MS / 1000} s; last answer ${JSON.stringify(last)}`);
    if (check && Date.now() - lastCheck > 2000) {
      lastCheck = Date.now();
      await check();
    }
    await sleep(POLL_MS);
  }
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGKILL");
  await Promise.race([exited, sleep(5000)]);
}

/** The same steps by hand: shallow clone, build, start, poll until the release answers. */
async function baselineRun(repo: FixtureRepo, marker: string): Promise<number> {
  const tmp = await mkdtemp(path.join(os.tmpdir(), "platform-bench-deploy-"));
  let child: ChildProcess | undefined;
  try {
    const port = await freePort();
    const src = path.join(tmp, "src");
    const t0 = performance.now();
    await execFileAsync("git", ["clone", "--quiet", "--depth", "1", "--single-branch", "--branch", repo.branch, "--", repo.url, src], {
      env: { ...process.env, GIT_CONFIG_NOSYSTEM: "1", GIT_TERMINAL_PROMPT: "0" },
    });
    await execFileAsync(process.execPath, ["build.js"], { cwd: src });
    child = spawn(process.execPath, ["server.js"], { cwd: src, env: { ...process.env, PORT: String(port) }, stdio: "ignore" });
    const spawned = child;
    await firstOk(port, marker, undefined, async () => {
      if (spawned.exitCode !== null) throw new Error(`baseline server exited with ${spawned.exitCode}`);
    });
    return performance.now() - t0;
  } finally {
    if (child) await stopChild(child);
    await rm(tmp, { recursive: true, force: true });
  }
}

interface PlatformRun {
  ms: number;
  breakdown: string;
}

const at = (iso: unknown): number | null => (typeof iso === "string" && iso ? Date.parse(iso) : null);
const span = (from: number | null, to: number | null) => (from === null || to === null ? "?" : seconds(to - from));

/** Build and auto-deploy the repository's HEAD; timed from the POST to the first 200 of the new release through the router. */
async function platformRun(fleet: TestFleet, key: string, repo: FixtureRepo, host: string, marker: string): Promise<PlatformRun> {
  const postedAt = Date.now();
  const t0 = performance.now();
  const b = await call(fleet, key, "POST", "/builds", { app_name: APP, repository: repo.url, auto_deploy: true });
  if (b.status !== 202) throw new Error(`POST /builds: ${b.status} ${JSON.stringify(b.body)}`);
  const buildId = String(b.body.build_id);
  const tag = String(b.body.tag);
  await firstOk(fleet.routerPort, marker, host, async () => {
    const build = await call(fleet, key, "GET", `/builds/id/${buildId}`);
    if (["failed", "cancelled"].includes(build.body?.status)) throw new Error(`build ${buildId} ${build.body.status}: ${build.body.error_message}`);
    const deploys = await call(fleet, key, "GET", `/deployments?app_name=${APP}`);
    const d = deploys.body.items?.find((x: any) => x.image_tag === tag);
    if (d && ["failed", "cancelled"].includes(d.status)) throw new Error(`deploy ${d.id} ${d.status}: ${d.error_message}`);
  });
  const ms = performance.now() - t0;
  const firstOkAt = postedAt + ms;

  // Not timed: wait for the deploy to be terminal (drain included), then read its timestamps.
  const deployId = await waitFor(
    async () => (await call(fleet, key, "GET", `/deployments?app_name=${APP}`)).body.items?.find((x: any) => x.image_tag === tag)?.id as string | undefined,
    (id) => !!id,
    60_000,
    `the deployment of ${tag}`,
  );
  const deploy = await waitFor(
    async () => (await call(fleet, key, "GET", `/deployments/${deployId}`)).body,
    (d: any) => ["completed", "failed", "cancelled"].includes(d.status),
    120_000,
    `deployment ${deployId} to finish`,
  );
  if (deploy.status !== "completed") throw new Error(`deployment ${deployId} ${deploy.status}: ${deploy.error_message}`);
  const build = (await call(fleet, key, "GET", `/builds/id/${buildId}`)).body;
  const history = await waitFor(
    async () => (await call(fleet, key, "GET", `/deployments/history?app_name=${APP}&limit=50`)).body.items?.find((h: any) => h.deployment_id === deployId),
    (h) => !!h,
    30_000,
    `the history record of ${deployId}`,
  );

  const buildStarted = at(build.started_at);
  const buildCompleted = at(build.completed_at);
  const claimed = at(history.started_at);
  const deployCompleted = at(deploy.completed_at);
  let breakdown =
    `queue ${span(postedAt, buildStarted)} (POST -> build started) + build ${span(buildStarted, buildCompleted)} (clone, build, package) + ` +
    `hand-off ${span(buildCompleted, claimed)} (build completed -> deploy claimed) + deploy ${span(claimed, firstOkAt)} (claimed -> first 200); ` +
    `deploy completed ${span(firstOkAt, deployCompleted)} after the first 200`;

  // Step by step: the agent's deploy and build log lines, stamped where they were written.
  // Log lines are ingested in batches: wait (a little) for the last line of the action to arrive.
  const timeline = async (query: string, from: number | null, label: string, last: RegExp) => {
    if (from === null) return;
    type Line = { timestamp: string; message: string };
    const rows = await waitFor(
      async () => ((await call(fleet, key, "GET", `/logs?${query}&limit=1000&since=1h`)).body?.logs ?? []) as Line[],
      (ls) => ls.some((l) => last.test(l.message)),
      15_000,
      `the log line ${last}`,
    ).catch(async () => ((await call(fleet, key, "GET", `/logs?${query}&limit=1000&since=1h`)).body?.logs ?? []) as Line[]);
    const lines = rows
      .map((l) => ({ ts: Date.parse(l.timestamp), message: l.message.length > 48 ? `${l.message.slice(0, 45)}...` : l.message }))
      .sort((a, b) => a.ts - b.ts);
    if (lines.length > 0) breakdown += `\n    ${label}: ${lines.map((l) => `+${((l.ts - from) / 1000).toFixed(2)} ${l.message}`).join(" | ")}`;
  };
  await timeline(`build_id=${buildId}&source=build`, buildStarted, "build log (from build started)", /^Image .* stored/);
  await timeline(`deployment_id=${deployId}&source=deploy`, claimed, `deploy log (from claimed; first 200 at +${claimed === null ? "?" : ((firstOkAt - claimed) / 1000).toFixed(2)})`, / is live /);
  return { ms, breakdown };
}

export async function run(): Promise<Verdict[]> {
  const started = performance.now();
  let fleet: TestFleet | undefined;
  let repo: FixtureRepo | undefined;
  try {
    fleet = await startTestFleet({ env: { LOG_LEVEL: "warn" } });
    repo = await makeFixtureRepo("node-web");
    const serverJs = await readFile(path.join(repo.dir, "server.js"), "utf8");

    const group = await call(fleet, fleet.rootKey, "POST", "/groups", { slug: "bench" });
    if (group.status !== 201) throw new Error(`group: ${group.status} ${JSON.stringify(group.body)}`);
    const keyRes = await call(fleet, fleet.rootKey, "POST", "/keys", { name: "bench", scope: "admin", group: "bench" });
    const key = String(keyRes.body.key);
    // Registration is not timed: the app exists and its preflight is ready before the first run.
    const created = await call(fleet, key, "POST", "/apps", { app_name: APP, repository: repo.url });
    if (created.status !== 201) throw new Error(`POST /apps: ${created.status} ${JSON.stringify(created.body)}`);
    await waitFor(async () => (await call(fleet!, key, "GET", `/apps/${APP}`)).body, (a: any) => a.preflight_status === "ready", 60_000, "preflight ready");
    const host = `${APP}.dev.localhost:${fleet.routerPort}`;
    const app = (await call(fleet, key, "GET", `/apps/${APP}`)).body;
    console.log(`app registered; its URL will be http://${host} (urls now ${JSON.stringify(app.urls)}); ${RUNS} run(s) of each side`);

    const platformMs: number[] = [];
    const baselineMs: number[] = [];
    // Run 0 of each side is a warm-up, not counted: the platform's first deploy also pays for
    // the first of everything (connections, compiled code paths, the app's first route), which
    // a platform that has been up a while has long paid.
    for (let i = 0; i <= RUNS; i++) {
      const marker = `hello from node-web bench-${i} (`;
      await repo.commit(`bench ${i}`, { "server.js": serverJs.replace("hello from node-web", `hello from node-web bench-${i}`) });
      const sides = i % 2 === 1 ? (["baseline", "platform"] as const) : (["platform", "baseline"] as const);
      const label = i === 0 ? "warm-up" : `run ${i}`;
      for (const side of sides) {
        await sleep(1000);
        if (side === "baseline") {
          const ms = await baselineRun(repo, marker);
          if (i > 0) baselineMs.push(ms);
          console.log(`  ${label} baseline: ${seconds(ms)}`);
        } else {
          const r = await platformRun(fleet, key, repo, host, marker);
          if (i > 0) platformMs.push(r.ms);
          console.log(`  ${label} platform: ${seconds(r.ms)} = ${r.breakdown}`);
        }
      }
    }

    const platform = median(platformMs);
    const baseline = median(baselineMs);
    const ratio = platform / baseline;
    const ok = ratio <= TARGET;
    console.log(
      `POST /api/builds (auto-deploy) to first 200 through the router: median ${seconds(platform)} (runs ${platformMs.map((m) => (m / 1000).toFixed(2)).join(", ")}) ` +
        `vs baseline clone+build+start ${seconds(baseline)} (runs ${baselineMs.map((m) => (m / 1000).toFixed(2)).join(", ")}) = ` +
        `${ratio.toFixed(2)}x the baseline; target <= ${TARGET}x ${ok ? "PASS" : "FAIL"} (whole benchmark ${((performance.now() - started) / 1000).toFixed(0)} s)`,
    );
    return [{ name: "build+deploy to first 200", ok }];
  } finally {
    await fleet?.stop().catch((err) => console.error(`fleet stop: ${err}`));
    await repo?.cleanup();
  }
}
