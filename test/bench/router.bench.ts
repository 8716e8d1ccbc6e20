/**
 * Router throughput (issue: deployments, item 9b): requests per second to a deployed app through
 * the router (Caddy, matched by Host header) against requesting the app's replica port directly
 * in the same run. Target: at least 60% of the direct figure, and no error or non-2xx answer
 * through the router.
 *
 * The node-web fixture is deployed once through the platform (register, preflight ready, build
 * with auto-deploy, deploy completed, its URL answers). The replica's port is read where the
 * router gets it: the `reverse_proxy` upstream of the app's front door in Caddy's config (admin
 * API at AGENT_ROUTER_ADMIN_URL). Both targets are warmed, then loaded with autocannon for the
 * same duration (BENCH_SECONDS, default 8) and connections (32, keep-alive), alternating direct
 * and router twice; the better run of each side is compared.
 */
import { caddyAdmin } from "@platform/fleet";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { makeFixtureRepo, type FixtureRepo } from "../fixtures/git.ts";
import { call, load, report, waitFor, warm, type LoadResult, type Verdict } from "./lib.ts";

const APP = "node-web";
const TARGET = 0.6;
const CONNECTIONS = 32;
const ROUNDS = 2;

interface CaddyRoute {
  "@id"?: string;
  match?: Array<{ host?: string[] }>;
  handle?: Array<{ handler: string; routes?: CaddyRoute[]; upstreams?: Array<{ dial: string }> }>;
}

/** Every `reverse_proxy` upstream under a route (subroutes included). */
function upstreamsOf(route: CaddyRoute): string[] {
  const out: string[] = [];
  for (const h of route.handle ?? []) {
    if (h.handler === "reverse_proxy") out.push(...(h.upstreams ?? []).map((u) => u.dial));
    for (const sub of h.routes ?? []) out.push(...upstreamsOf(sub));
  }
  return out;
}

/** The replica the router sends the app's host name to, from Caddy's own config. */
async function replicaFromCaddy(adminUrl: string, hostname: string): Promise<{ host: string; port: number }> {
  const res = await caddyAdmin(adminUrl, "GET", "/config/apps/http/servers/platform/routes", { timeoutMs: 10_000 });
  if (res.status !== 200) throw new Error(`Caddy admin: ${res.status} ${res.text}`);
  const routes = JSON.parse(res.text) as CaddyRoute[];
  const route = routes.find((r) => r.match?.some((m) => m.host?.includes(hostname)));
  if (!route) throw new Error(`no route for ${hostname} in Caddy's config: ${JSON.stringify(routes)}`);
  const dials = upstreamsOf(route);
  if (dials.length !== 1) throw new Error(`expected one upstream for ${hostname}, found ${JSON.stringify(dials)}`);
  const dial = dials[0]!;
  const colon = dial.lastIndexOf(":");
  return { host: dial.slice(0, colon).replace(/^\[|\]$/g, "") || "127.0.0.1", port: Number(dial.slice(colon + 1)) };
}

const line = (r: LoadResult) =>
  `${r.requestsPerSecond.toFixed(0)} req/s, p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms, errors ${r.errors}, non-2xx ${r.non2xx}`;

export async function run(): Promise<Verdict[]> {
  let fleet: TestFleet | undefined;
  let repo: FixtureRepo | undefined;
  try {
    fleet = await startTestFleet({ env: { LOG_LEVEL: "warn" } });
    const f = fleet;
    repo = await makeFixtureRepo("node-web");

    // Deploy the fixture once through the platform.
    const group = await call(f, f.rootKey, "POST", "/groups", { slug: "bench" });
    if (group.status !== 201) throw new Error(`group: ${group.status} ${JSON.stringify(group.body)}`);
    const key = String((await call(f, f.rootKey, "POST", "/keys", { name: "bench", scope: "admin", group: "bench" })).body.key);
    const created = await call(f, key, "POST", "/apps", { app_name: APP, repository: repo.url });
    if (created.status !== 201) throw new Error(`POST /apps: ${created.status} ${JSON.stringify(created.body)}`);
    await waitFor(async () => (await call(f, key, "GET", `/apps/${APP}`)).body, (a: any) => a.preflight_status === "ready", 60_000, "preflight ready");
    const b = await call(f, key, "POST", "/builds", { app_name: APP, repository: repo.url, auto_deploy: true });
    if (b.status !== 202) throw new Error(`POST /builds: ${b.status} ${JSON.stringify(b.body)}`);
    const deployId = await waitFor(
      async () => (await call(f, key, "GET", `/deployments?app_name=${APP}`)).body.items?.find((d: any) => d.image_tag === b.body.tag)?.id as string | undefined,
      (id) => !!id,
      120_000,
      "the deployment",
    );
    const deploy = await waitFor(
      async () => (await call(f, key, "GET", `/deployments/${deployId}`)).body,
      (d: any) => ["completed", "failed", "cancelled"].includes(d.status),
      180_000,
      "the deploy to finish",
    );
    if (deploy.status !== "completed") throw new Error(`deploy ${deploy.status}: ${deploy.error_message}`);
    const app = await waitFor(async () => (await call(f, key, "GET", `/apps/${APP}`)).body, (a: any) => Array.isArray(a.urls) && a.urls.length > 0, 30_000, "the app's URL");
    const appUrl = new URL(app.urls[0] as string);
    const hostHeader = appUrl.host;

    const adminUrl = f.env.AGENT_ROUTER_ADMIN_URL;
    if (!adminUrl) throw new Error("the fleet has no AGENT_ROUTER_ADMIN_URL");
    const replica = await replicaFromCaddy(adminUrl, appUrl.hostname);
    const directUrl = `http://127.0.0.1:${replica.port}/`;
    const routerUrl = `${f.routerUrl}/`;
    const headers = { host: hostHeader };

    // Both answer the same release before anything is measured.
    const direct = await fetch(directUrl).then(async (r) => `${r.status} ${await r.text()}`);
    const routed = await load(routerUrl, { headers, seconds: 1, connections: 1 });
    if (!direct.startsWith("200 hello from node-web") || routed.non2xx > 0 || routed.errors > 0) {
      throw new Error(`the app does not answer: direct ${JSON.stringify(direct)}, router ${line(routed)}`);
    }
    console.log(`${app.urls[0]} deployed (${b.body.tag}); the router's upstream is ${replica.host}:${replica.port}; ${CONNECTIONS} connections, ${process.env.BENCH_SECONDS ?? 8} s per run`);

    await warm(directUrl);
    await warm(routerUrl, headers);
    const directRuns: LoadResult[] = [];
    const routerRuns: LoadResult[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      const d = await load(directUrl, { connections: CONNECTIONS });
      directRuns.push(d);
      console.log(`  round ${round} direct ${directUrl}: ${line(d)}`);
      const r = await load(routerUrl, { headers, connections: CONNECTIONS });
      routerRuns.push(r);
      console.log(`  round ${round} router ${routerUrl} (host ${hostHeader}): ${line(r)}`);
    }
    const best = (runs: LoadResult[]) => runs.reduce((a, c) => (c.requestsPerSecond > a.requestsPerSecond ? c : a));
    const sum = (runs: LoadResult[], k: "errors" | "non2xx") => runs.reduce((n, c) => n + c[k], 0);
    // Any failed answer through the router, in any round, fails the target.
    const subject = { ...best(routerRuns), errors: sum(routerRuns, "errors"), non2xx: sum(routerRuns, "non2xx") };
    const baseline = best(directRuns);
    if (sum(directRuns, "errors") || sum(directRuns, "non2xx")) {
      console.log(`  direct runs had errors ${sum(directRuns, "errors")}, non-2xx ${sum(directRuns, "non2xx")}`);
    }
    return [report(`GET / of a deployed app through the router vs its replica port directly (best of ${ROUNDS})`, subject, baseline, TARGET)];
  } finally {
    await fleet?.stop().catch((err) => console.error(`fleet stop: ${err}`));
    await repo?.cleanup();
  }
}
