/**
 * Fault injection: a service of the fleet killed (SIGKILL) while clients keep sending
 * POST /api/builds. Postgres is the record, events leave through an outbox and consumers are
 * idempotent, so once the killed service is back, whatever the client was told:
 * - every build answered 202 exists, with exactly one BUILD action in the queue;
 * - a request that failed with the kill left either both (it committed before the answer was
 *   lost) or neither: the app's builds, its queue actions and its build_count agree.
 * No agent runs here: the builds stay queued, which is what is checked.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { call } from "../e2e/support.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const REQUESTS = 240;
const WORKERS = 6;

let fleet: TestFleet;
let key: string;

beforeAll(async () => {
  fleet = await startTestFleet({ agent: false });
  await call(fleet.api, "POST", "/groups", { credential: fleet.rootKey, body: { slug: "acme" } });
  key = (await call(fleet.api, "POST", "/keys", { credential: fleet.rootKey, body: { name: "acme", scope: "admin", group: "acme" } })).body.key;
});

afterAll(async () => {
  await fleet?.stop();
});

interface Burst {
  accepted: string[];
  /** Requests that got no 202 (an error answer or a broken connection) while the service was down. */
  failed: number;
  /** Builds answered 202 between the kill and the service being ready again. */
  acceptedWhileDown: number;
  /** Builds answered 202 after the killed service was ready again. */
  acceptedAfter: number;
}

/**
 * POST /api/builds for `app` from WORKERS clients until REQUESTS were answered 202; when a third
 * of them were, `service` is killed and started again while the clients go on.
 */
async function burstKilling(app: string, service: string): Promise<Burst> {
  const body = { app_name: app, repository: `https://example.com/acme/${app}.git`, auto_deploy: true };
  const post = () => call(fleet.api, "POST", "/builds?skip_preflight=true", { credential: key, body }).catch(() => null);
  // The first build registers the app, before any concurrency.
  const first = await post();
  expect(first?.status).toBe(202);
  const accepted: string[] = [first!.body.build_id];
  let failed = 0;
  let acceptedWhileDown = 0;
  let acceptedAfter = 0;
  let back = false;
  let restarted: Promise<void> | undefined;
  const deadline = Date.now() + 90_000;
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (accepted.length < REQUESTS && Date.now() < deadline) {
        const r = await post();
        if (r?.status === 202) {
          accepted.push(r.body.build_id);
          if (back) acceptedAfter++;
          else if (restarted) acceptedWhileDown++;
          // Paced, so that the kill lands in the middle of the burst rather than after it.
          await sleep(20);
        } else {
          failed++;
          await sleep(50);
        }
        if (!restarted && accepted.length >= REQUESTS / 3) {
          restarted = fleet.restart(service).then(() => {
            back = true;
          });
        }
      }
    }),
  );
  await restarted;
  return { accepted, failed, acceptedWhileDown, acceptedAfter };
}

/** Every build of the app, paged. */
async function buildsOf(app: string): Promise<string[]> {
  const ids: string[] = [];
  for (let offset = 0; ; offset += 200) {
    const page = await call(fleet.api, "GET", `/builds?app_name=${app}&limit=200&offset=${offset}`, { credential: key });
    expect(page.status).toBe(200);
    ids.push(...page.body.items.map((b: { id: string }) => b.id));
    if (page.body.items.length < 200) return ids;
  }
}

async function actionsOf(app: string): Promise<Array<{ action_id: string; action_type: string; depends_on: string | null }>> {
  const r = await call(fleet.api, "GET", `/deployments/queue?app_name=${app}&all=true&limit=500`, { credential: key });
  expect(r.status).toBe(200);
  return r.body;
}

async function expectConsistent(app: string, burst: Burst) {
  // The outbox drains once the killed service is back: wait until the queue has caught up.
  await expect
    .poll(async () => (await actionsOf(app)).filter((a) => a.action_type === "BUILD").length, { timeout: 60_000, interval: 500 })
    .toBe((await buildsOf(app)).length);
  const builds = await buildsOf(app);
  const actions = await actionsOf(app);
  const buildActions = actions.filter((a) => a.action_type === "BUILD").map((a) => a.action_id);
  expect(new Set(builds).size).toBe(builds.length);
  expect(new Set(buildActions).size).toBe(buildActions.length);
  expect([...buildActions].sort()).toEqual([...builds].sort());
  for (const id of burst.accepted) expect(builds).toContain(id);
  // auto_deploy: each build has its one dependent DEPLOY.
  const deploys = actions.filter((a) => a.action_type === "DEPLOY").map((a) => a.depends_on);
  expect([...deploys].sort()).toEqual([...builds].sort());
  expect((await call(fleet.api, "GET", `/apps/${app}`, { credential: key })).body.build_count).toBe(builds.length);
  // Nothing accepted was answered twice.
  expect(new Set(burst.accepted).size).toBe(burst.accepted.length);
}

describe("POST /api/builds while a service is killed", () => {
  it("apps-builds killed: every accepted build has its one action, and nothing is half-written", async () => {
    const burst = await burstKilling("crash-apps", "apps-builds");
    expect(burst.accepted.length).toBeGreaterThanOrEqual(REQUESTS);
    expect(burst.failed).toBeGreaterThan(0);
    expect(burst.acceptedAfter).toBeGreaterThan(0);
    await expectConsistent("crash-apps", burst);
  });

  it("deploy-queue killed: builds accepted meanwhile reach the queue once it is back, once each", async () => {
    const burst = await burstKilling("crash-queue", "deploy-queue");
    expect(burst.accepted.length).toBeGreaterThanOrEqual(REQUESTS);
    // Taking a build needs apps-builds alone: the queue catches up from the outbox's events.
    expect(burst.acceptedWhileDown).toBeGreaterThan(0);
    await expectConsistent("crash-queue", burst);
  });
});
