/**
 * What a retry re-runs (spec doc 1 section 4.4, POST /api/apps/{app}/retry) against a real
 * Postgres: the branch's latest deployment, which must have failed; an undeploy since then is the
 * last word, so a retry would not bring the branch back.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { serviceSchema } from "@platform/config";
import { openDatabase, type EntityManager, type MikroORM } from "@platform/db";
import { createTestDatabase, dropDatabase } from "@platform/testing";
import { Action, entities } from "../src/entities/index.ts";
import { migrations } from "../src/migrations/0001_queue.ts";
import { deploymentMigrations } from "../src/migrations/0002_deployments.ts";
import { lockedRetryTarget, retryTarget } from "../src/domain/deployments.ts";

let databaseUrl: string;
let orm: MikroORM;

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  orm = await openDatabase({ url: databaseUrl, schema: serviceSchema("deploy-queue"), entities, migrations: [...migrations, ...deploymentMigrations], poolMax: 8 });
});

afterAll(async () => {
  await orm?.close(true);
  if (databaseUrl) await dropDatabase(databaseUrl);
});

const write = <T>(fn: (em: EntityManager) => Promise<T>) => orm.em.fork().transactional(fn);

async function action(appName: string, actionType: string, status: string, minutesAgo: number, dependsOn: string | null = null): Promise<Action> {
  return write(async (em) =>
    em.create(Action, {
      id: randomUUID(),
      groupSlug: "acme",
      appName,
      branch: "main",
      actionType,
      status,
      imageTag: "main-1",
      deployWarnings: [],
      payload: {},
      createdBy: "api_key:k",
      createdAt: new Date(Date.now() - minutesAgo * 60_000),
      dependsOn,
    }),
  );
}

const target = (appName: string) => write((em) => retryTarget(em, "acme", appName, "main"));

describe("retryTarget", () => {
  it("is the latest deployment when it failed", async () => {
    await action("shop", "DEPLOY", "completed", 10);
    const failed = await action("shop", "DEPLOY", "failed", 5);
    expect((await target("shop")).id).toBe(failed.id);
  });

  it("refuses nothing_to_retry when the branch was undeployed after its failed deploy", async () => {
    await action("cart", "DEPLOY", "failed", 10);
    await action("cart", "UNDEPLOY", "completed", 5);
    await expect(target("cart")).rejects.toMatchObject({ status: 409, detail: { code: "nothing_to_retry", message: expect.stringContaining("is an undeploy (completed)") } });
  });

  it("refuses build_not_completed when the deploy failed because its build did not complete", async () => {
    const build = await action("api", "BUILD", "failed", 10);
    await action("api", "DEPLOY", "failed", 9, build.id);
    await expect(target("api")).rejects.toMatchObject({
      status: 409,
      detail: { code: "build_not_completed", build_id: build.id, message: expect.stringContaining(`its build ${build.id} failed`) },
    });
    // A deploy that ran after its build completed is retried.
    const rebuilt = await action("api", "BUILD", "completed", 5);
    const deploy = await action("api", "DEPLOY", "failed", 4, rebuilt.id);
    expect((await target("api")).id).toBe(deploy.id);
  });

  it("queues one RETRY of concurrent retries under the lock; the others find it latest", async () => {
    await action("cms", "DEPLOY", "failed", 10);
    const outcomes = await Promise.allSettled(
      Array.from({ length: 6 }, () =>
        write(async (em) => {
          const failed = await lockedRetryTarget(em, "acme", "cms", "main");
          em.create(Action, { id: randomUUID(), groupSlug: "acme", appName: "cms", branch: "main", actionType: "RETRY", status: "queued", imageTag: failed.imageTag, deployWarnings: [], payload: {}, createdBy: "api_key:k", dependsOn: null });
        }),
      ),
    );
    expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(1);
    for (const o of outcomes) if (o.status === "rejected") expect(o.reason).toMatchObject({ status: 409, detail: { code: "nothing_to_retry" } });
  });

  it("counts only the deployments since the branch was registered: an earlier registration's failure is not retried", async () => {
    await action("shop-again", "DEPLOY", "failed", 10);
    const registeredAt = new Date(Date.now() - 5 * 60_000);
    await expect(write((em) => retryTarget(em, "acme", "shop-again", "main", registeredAt))).rejects.toMatchObject({
      status: 409,
      detail: { code: "nothing_to_retry", message: "App 'shop-again' (branch main) has no deploy to retry." },
    });
    const failed = await action("shop-again", "DEPLOY", "failed", 1);
    expect((await write((em) => retryTarget(em, "acme", "shop-again", "main", registeredAt))).id).toBe(failed.id);
  });

  it("refuses nothing_to_retry when the latest deployment did not fail", async () => {
    await action("blog", "DEPLOY", "failed", 10);
    await action("blog", "RETRY", "completed", 5);
    await expect(target("blog")).rejects.toMatchObject({ status: 409, detail: { code: "nothing_to_retry" } });
  });
});
