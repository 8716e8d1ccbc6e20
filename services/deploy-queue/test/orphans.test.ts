/**
 * Orphaned actions against a real Postgres: an action whose claiming agent went silent and that
 * has reported no progress for ORPHANED_ACTION_AFTER_S (3 minutes here, its default) fails with an error naming the host, its queued
 * dependents fail with it, and every deployment made terminal gets its immutable history record
 * (spec doc 1 section 2.4) and an action_updated event in the same transaction.
 *
 * The schema is opened directly (openDatabase with the service's entities and migrations) rather
 * than through the running service: the service's own periodic job runs failOrphanedActions too,
 * and would race the calls this test makes.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { serviceSchema } from "@platform/config";
import { OutboxEvent, openDatabase, type EntityManager, type MikroORM } from "@platform/db";
import { createTestDatabase, dropDatabase } from "@platform/testing";
import { Action, Agent, entities, HistoryRecord } from "../src/entities/index.ts";
import { migrations } from "../src/migrations/0001_queue.ts";
import { deploymentMigrations } from "../src/migrations/0002_deployments.ts";
import { failOrphanedActions, orphanWait } from "../src/domain/orphans.ts";
import { reportProgress } from "../src/domain/claims.ts";

let databaseUrl: string;
let orm: MikroORM;

const now = new Date();
const AFTER_MS = 3 * 60_000;
const minutesAgo = (m: number) => new Date(now.getTime() - m * 60_000);

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  orm = await openDatabase({
    url: databaseUrl,
    schema: serviceSchema("deploy-queue"),
    entities,
    migrations: [...migrations, ...deploymentMigrations],
    poolMax: 3,
  });
});

afterAll(async () => {
  await orm?.close(true);
  if (databaseUrl) await dropDatabase(databaseUrl);
});

const write = <T>(fn: (em: EntityManager) => Promise<T>) => orm.em.fork().transactional(fn);
const row = (id: string) => orm.em.fork().findOneOrFail(Action, { id });

async function agent(hostId: string, lastSeen: Date) {
  await write(async (em) => {
    em.create(Agent, { hostId, lastSeen, facts: {}, version: "0.1.0" });
  });
}

let counter = 0;
async function action(fields: Partial<Action> & Pick<Action, "actionType" | "status">): Promise<Action> {
  counter += 1;
  return write(async (em) =>
    em.create(Action, {
      id: randomUUID(),
      groupSlug: "acme",
      appName: `orphan${counter}`,
      branch: "main",
      imageTag: `main-${counter}`,
      deployWarnings: [],
      payload: {},
      createdBy: "api_key:k",
      createdAt: minutesAgo(20),
      ...fields,
    }),
  );
}

/** An in_progress action claimed by `host` 15 minutes ago whose last progress was `progressMinutes` ago. */
const claimed = (actionType: string, host: string | null, progressMinutes: number, extra: Partial<Action> = {}) =>
  action({ actionType, status: "in_progress", claimedBy: host, claimedAt: minutesAgo(15), progressAt: minutesAgo(progressMinutes), phase: "start", ...extra });

describe("failOrphanedActions", () => {
  it("fails an action whose agent has been silent with no progress, naming the host and when it was last heard from", async () => {
    // Its last heartbeat came before the action's last progress report: the report is when it was last heard from.
    await agent("h-dead", minutesAgo(11));
    const build = await claimed("BUILD", "h-dead", 10);
    const deploy = await action({ actionType: "DEPLOY", status: "queued", dependsOn: build.id, appName: build.appName, imageTag: build.imageTag });

    const failed = await write((em) => failOrphanedActions(em, now, AFTER_MS));
    expect(failed.map((a) => a.id)).toContain(build.id);

    const b = await row(build.id);
    expect(b.status).toBe("failed");
    expect(b.completedAt?.getTime()).toBe(now.getTime());
    expect(b.errorMessage).toContain("host h-dead");
    expect(b.errorMessage).toContain(minutesAgo(10).toISOString());
    expect(b.errorMessage).toContain("after 3 minutes without progress");

    // Its queued dependent DEPLOY cannot run without it: it fails too, naming the dependency.
    const d = await row(deploy.id);
    expect(d.status).toBe("failed");
    expect(d.errorMessage).toBe(`Dependency BUILD ${build.id} failed.`);

    // The DEPLOY became terminal, so it has a history record (it never ran: no start, no duration, no env vars).
    const history = await orm.em.fork().findOneOrFail(HistoryRecord, { deploymentId: deploy.id });
    expect(history).toMatchObject({
      actionType: "DEPLOY",
      status: "failed",
      appName: build.appName,
      branch: "main",
      imageTag: build.imageTag,
      startedAt: null,
      durationSeconds: null,
      envVarsSnapshot: {},
    });
    // A BUILD is not a deployment: no history record for it.
    expect(await orm.em.fork().count(HistoryRecord, { deploymentId: build.id })).toBe(0);

    // Both changes are announced as action_updated in the same transaction.
    const events = await orm.em.fork().find(OutboxEvent, { subject: { $like: "%action_updated" } });
    const statuses = events.filter((e) => e.payload.action_id === build.id || e.payload.action_id === deploy.id).map((e) => [e.payload.action_id, e.payload.status]);
    expect(statuses).toEqual(expect.arrayContaining([[build.id, "failed"], [deploy.id, "failed"]]));
  });

  it("records the history of an orphaned DEPLOY itself, with its duration from the claim and the tag it replaced", async () => {
    await agent("h-gone", minutesAgo(10));
    const deploy = await claimed("DEPLOY", "h-gone", 10, { payload: { previous_tag: "main-0" } });
    await write((em) => failOrphanedActions(em, now, AFTER_MS));

    expect((await row(deploy.id)).status).toBe("failed");
    const history = await orm.em.fork().findOneOrFail(HistoryRecord, { deploymentId: deploy.id });
    expect(history).toMatchObject({ status: "failed", previousTag: "main-0", durationSeconds: 15 * 60 });
    expect(history.startedAt?.getTime()).toBe(minutesAgo(15).getTime());
  });

  it("records a deploy past its swap commit completed, with a warning: past the point of no return it rolls forward", async () => {
    await agent("h-flipped", minutesAgo(10));
    const deploy = await claimed("DEPLOY", "h-flipped", 10, { phase: "drain", swapCommittedAt: minutesAgo(11), payload: { previous_tag: "main-0" } });
    await write((em) => failOrphanedActions(em, now, AFTER_MS));
    const r = await row(deploy.id);
    expect(r).toMatchObject({ status: "completed", errorMessage: null });
    expect(r.deployWarnings).toEqual([expect.stringMatching(/^The agent on host h-flipped stopped responding .* after the swap commit; past the point of no return the deploy rolls forward/)]);
    expect(await orm.em.fork().findOneOrFail(HistoryRecord, { deploymentId: deploy.id })).toMatchObject({ status: "completed", previousTag: "main-0" });
    const events = await orm.em.fork().find(OutboxEvent, { subject: { $like: "%action_updated" } });
    expect(events.filter((e) => e.payload.action_id === deploy.id).map((e) => e.payload.status)).toEqual(["completed"]);
    // Its agent, heard from again, is told to go on with the flip (and nobody else to run it).
    expect(await write((em) => reportProgress(em, { actionId: deploy.id, hostId: "h-flipped", phase: "swap_committed", message: "" }, now))).toEqual({ cancelRequested: false });
    expect(await write((em) => reportProgress(em, { actionId: deploy.id, hostId: "h-other", phase: "swap_committed", message: "" }, now))).toEqual({ cancelRequested: true });
  });

  it("fails an action claimed by a host that never sent a heartbeat, saying so", async () => {
    const a = await claimed("DEPLOY", "h-never", 10);
    await write((em) => failOrphanedActions(em, now, AFTER_MS));
    const r = await row(a.id);
    expect(r.status).toBe("failed");
    expect(r.errorMessage).toContain("host h-never");
    expect(r.errorMessage).toContain("it never sent a heartbeat");
  });

  it("leaves an action alone while its agent is live, however long since its last progress", async () => {
    await agent("h-alive", new Date(now.getTime() - 5_000));
    const a = await claimed("DEPLOY", "h-alive", 10);
    const failed = await write((em) => failOrphanedActions(em, now, AFTER_MS));
    expect(failed.map((x) => x.id)).not.toContain(a.id);
    expect((await row(a.id)).status).toBe("in_progress");
  });

  it("leaves an action of a silent agent alone until it has gone the wait without progress", async () => {
    await agent("h-quiet", minutesAgo(10));
    // Progress 2 minutes ago (under the 3-minute limit), though the claim itself is older.
    const a = await claimed("DEPLOY", "h-quiet", 2);
    await write((em) => failOrphanedActions(em, now, AFTER_MS));
    expect((await row(a.id)).status).toBe("in_progress");
    // No progress report at all: the claim time counts.
    const fresh = await action({ actionType: "DEPLOY", status: "in_progress", claimedBy: "h-quiet", claimedAt: minutesAgo(1), progressAt: null });
    await write((em) => failOrphanedActions(em, now, AFTER_MS));
    expect((await row(fresh.id)).status).toBe("in_progress");
    expect(await orm.em.fork().count(HistoryRecord, { deploymentId: { $in: [a.id, fresh.id] } })).toBe(0);
  });

  it("does nothing to queued or terminal actions, and finds nothing on a second run", async () => {
    const queued = await action({ actionType: "DEPLOY", status: "queued", claimedBy: null, createdAt: minutesAgo(60) });
    const done = await action({ actionType: "DEPLOY", status: "completed", claimedBy: "h-dead", claimedAt: minutesAgo(30), progressAt: minutesAgo(30), completedAt: minutesAgo(29) });
    await write((em) => failOrphanedActions(em, now, AFTER_MS));
    expect((await row(queued.id)).status).toBe("queued");
    expect((await row(done.id)).status).toBe("completed");
    expect(await write((em) => failOrphanedActions(em, now, AFTER_MS))).toEqual([]);
  });
});

describe("orphanWait", () => {
  it("says the wait as the messages do", () => {
    expect([orphanWait(180_000), orphanWait(60_000), orphanWait(45_000), orphanWait(90_000)]).toEqual(["3 minutes", "1 minute", "45 s", "90 s"]);
  });
});
