/**
 * Scale (spec doc 1 section 4.4) through deploy-queue's Connect API, against the real Postgres
 * and NATS with a real apps-builds (and the identity it takes group locks from): the in-flight
 * check, apps-builds' save and the queued DEPLOY are one critical section per branch, so of
 * concurrent scales exactly one saves and queues, and every other one is refused
 * (scale_in_flight) before anything of it is saved.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { appsBuildsEnv, deployQueueEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService, DeployQueueService } from "@platform/proto";
import { makeCaller } from "@platform/caller";
import { createTestDatabase, deleteBusStreams, dropDatabase, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { Action } from "../src/entities/index.ts";
import { build as buildAppsBuilds } from "../../apps-builds/src/app.ts";
import { App } from "../../apps-builds/src/entities/index.ts";
import { completedBuild } from "../../apps-builds/test/rows.ts";
import { startIdentity, type TestIdentity } from "../../apps-builds/test/identity.ts";

let databaseUrl: string;
let prefix: string;
let identity: TestIdentity;
let appsBuilds: RunningService;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof DeployQueueService>>;
let apps: ReturnType<typeof createServiceClient<typeof AppsBuildsService>>;

const acme = makeCaller({ kind: "api_key", principalId: "k-acme-deploy", scope: "deploy", visibleGroups: ["acme"], selectedGroup: "acme" });
const RUNNING_TAG = "main-00000001";

/** A registered app whose branch main runs RUNNING_TAG (a completed build) with one replica of `web`. */
async function runningApp(appName: string): Promise<void> {
  await apps.registerApp({ caller: acme, appName, repository: `https://example.com/acme/${appName}.git` });
  await appsBuilds.ctx.write(async (em) => {
    const app = await em.findOneOrFail(App, { appName, branch: "main" });
    Object.assign(app, {
      baseConfig: { type: "container", services: { web: { run: "node server.js", port: 8080, health: "/healthz", replicas: 1 } } },
      overlay: {},
      deployStatus: "running",
      runningVersion: RUNNING_TAG,
      preflightStatus: "ready",
    });
    completedBuild(em, app, RUNNING_TAG);
  });
}

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  identity = await startIdentity({ databaseUrl, prefix, groups: ["acme"] });
  appsBuilds = await buildAppsBuilds(
    loadConfig(appsBuildsEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent", IDENTITY_URL: identity.url }),
  );
  const appsBuildsUrl = `http://127.0.0.1:${appsBuilds.rpc.port}`;
  apps = createServiceClient(AppsBuildsService, appsBuildsUrl);
  service = await build(
    loadConfig(deployQueueEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent", APPS_BUILDS_URL: appsBuildsUrl }),
  );
  client = createServiceClient(DeployQueueService, `http://127.0.0.1:${service.rpc.port}`);
});

afterAll(async () => {
  await service?.close();
  await appsBuilds?.close();
  await identity?.service.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

describe("scale", () => {
  it("of parallel scales of one service, queues exactly one DEPLOY and refuses every other one (scale_in_flight) before saving it", async () => {
    await runningApp("burst");
    const counts = [2, 3, 2, 3, 2];
    const outcomes = await Promise.all(
      counts.map((replicas) =>
        client.scaleService({ caller: acme, appName: "burst", branch: "main", service: "web", replicas }).then(
          (ok) => ({ replicas, ok, refused: null }),
          async (err: unknown) => ({ replicas, ok: null, refused: await refusal(Promise.reject(err)) }),
        ),
      ),
    );
    const winners = outcomes.filter((o) => o.ok);
    expect(winners, JSON.stringify(outcomes)).toHaveLength(1);
    const winner = winners[0]!;
    expect(winner.ok).toMatchObject({ previous: 1, requested: winner.replicas, noop: false, actionId: expect.any(String), overlayPaths: ["services.web.replicas"] });
    expect(winner.ok!.actionId).not.toBe("");
    for (const o of outcomes.filter((x) => !x.ok)) {
      expect(o.refused).toMatchObject({ status: 409, detail: { code: "scale_in_flight", action_id: winner.ok!.actionId, action_type: "DEPLOY", status: "queued" } });
    }

    const deploys = await service.ctx.read((em) => em.find(Action, { groupSlug: "acme", appName: "burst", branch: "main", actionType: "DEPLOY" }));
    expect(deploys.map((a) => a.id)).toEqual([winner.ok!.actionId]);
    expect(deploys[0]).toMatchObject({ status: "queued", imageTag: RUNNING_TAG });
    const saved = await appsBuilds.ctx.read((em) => em.findOneOrFail(App, { appName: "burst", branch: "main" }));
    expect(saved.overlay).toEqual({ "services.web.replicas": { value: winner.replicas, base: 1 } });
  });
});
