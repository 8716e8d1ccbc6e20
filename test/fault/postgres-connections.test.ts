/**
 * Fault injection: every Postgres connection of the fleet killed at once (as a database restart
 * or a failover does), twice, while clients keep using the platform. Each service's pool opens
 * new connections; listeners and relays that hold one of their own must notice too:
 * - builds accepted around the kills all reach the queue, each with its one BUILD action;
 * - afterwards a new commit is built and deployed end to end, and its log lines are stored.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import type { FixtureRepo } from "../fixtures/git.ts";
import { call, viaRouter, waitFor } from "../e2e/support.ts";
import { APP, acmeTenant, deployedTag, registeredWeb, type Tenant } from "./support.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let fleet: TestFleet;
let t: Tenant;
let api: string;
let acme: string;
let web: FixtureRepo;
let serverJs: string;

beforeAll(async () => {
  fleet = await startTestFleet();
  t = await acmeTenant(fleet);
  ({ api, key: acme } = t);
  ({ repo: web, serverJs } = await registeredWeb(t));
});

afterAll(async () => {
  await fleet?.stop();
  await web?.cleanup();
});

/** Terminates every backend connected to the fleet's database but this one; returns how many. */
async function killConnections(): Promise<number> {
  const client = new pg.Client({ connectionString: fleet.databaseUrl });
  await client.connect();
  try {
    const r = await client.query("select count(*)::int as n from (select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()) t");
    return r.rows[0].n as number;
  } finally {
    await client.end();
  }
}

describe("every Postgres connection of the fleet killed", () => {
  it("builds accepted around the kills all reach the queue, once each", async () => {
    const accepted: string[] = [];
    let killed = 0;
    const body = { app_name: APP, repository: web.url, auto_deploy: false };
    const clients = Array.from({ length: 3 }, async () => {
      for (let i = 0; i < 6; i++) {
        const r = await call(api, "POST", "/builds", { credential: acme, body }).catch(() => null);
        if (r?.status === 202) accepted.push(r.body.build_id);
        await sleep(150);
      }
    });
    await sleep(300);
    killed += await killConnections();
    await sleep(700);
    killed += await killConnections();
    await Promise.all(clients);
    expect(killed).toBeGreaterThan(0);
    expect(accepted.length).toBeGreaterThan(0);
    for (const id of accepted) {
      await waitFor(async () => (await call(api, "GET", `/deployments/queue/${id}`, { credential: acme })).status, (s) => s === 200, 60_000);
    }
    const actions = (await call(api, "GET", `/deployments/queue?app_name=${APP}&all=true&limit=500`, { credential: acme })).body as Array<{ action_id: string; action_type: string }>;
    const builds = (await call(api, "GET", `/builds?app_name=${APP}&limit=200`, { credential: acme })).body.items.map((b: { id: string }) => b.id);
    const buildActions = actions.filter((a) => a.action_type === "BUILD").map((a) => a.action_id);
    expect([...buildActions].sort()).toEqual([...builds].sort());
  });

  it("afterwards builds and deploys a new commit end to end, and its log lines are stored", async () => {
    await web.commit("after the kills", { "server.js": serverJs.replace("hello from node-web", "hello again from node-web") });
    const b = await call(api, "POST", "/builds", { credential: acme, body: { app_name: APP, repository: web.url, auto_deploy: true } });
    expect(b.status).toBe(202);
    expect(await deployedTag(t, b.body.tag)).toMatchObject({ status: "completed", error_message: null });
    // The app row learns of the deploy from the queue's events, a moment after the deployment row.
    const app = await waitFor(
      async () => (await call(api, "GET", `/apps/${APP}`, { credential: acme })).body,
      (a) => a.running_version === b.body.tag,
      30_000,
    );
    expect(app).toMatchObject({ running_version: b.body.tag, last_build_status: "completed" });
    expect(await viaRouter(app.urls[0])).toMatchObject({ status: 200, body: "hello again from node-web (/)\n" });
    await waitFor(
      async () => (await call(api, "GET", `/logs?build_id=${b.body.build_id}&source=build&since=1h`, { credential: acme })).body.logs as Array<{ message: string }>,
      (ls) => ls.some((l) => /^Image .* stored/.test(l.message)),
      30_000,
    );
  });
});
