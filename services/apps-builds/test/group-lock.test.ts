/**
 * The group lock of registration (spec doc 1 sections 4.4 and 7): how lease answers become the
 * spec's refusals, then registrations against a real identity and the real Postgres and NATS,
 * each race driven for real: a lease held through identity's RPC, a rename or delete queued
 * behind it, and a registration's write held back by a concurrent transaction while its lease
 * lapses. Last, the group_renamed consumer re-keying apps and builds.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { appsBuildsEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService, GroupLeaseOutcomeSchema } from "@platform/proto";
import { makeCaller, type Caller } from "@platform/caller";
import { PlatformError } from "@platform/errors";
import { createTestDatabase, deleteBusStreams, dropDatabase, freePort, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { App, Build } from "../src/entities/index.ts";
import { confirmedOrRefusal, leaseOrRefusal } from "../src/domain/group-lock.ts";
import { operator, startIdentity, type TestIdentity } from "./identity.ts";

const outcome = (o: MessageInitShape<typeof GroupLeaseOutcomeSchema>) => create(GroupLeaseOutcomeSchema, o);

function thrown(fn: () => unknown): PlatformError {
  try {
    fn();
  } catch (err) {
    if (err instanceof PlatformError) return err;
    throw err;
  }
  throw new Error("expected a refusal");
}

describe("lease answers as the spec's refusals", () => {
  it("while waiting: busy, renamed (with the current slug), deleted, unknown", () => {
    const lease = { id: "l", groupId: "g", groupSlug: "acme", formerSlugs: [], mode: "shared", expiresAtMs: 0n };
    expect(leaseOrRefusal("acme", outcome({ outcome: "granted", lease })).id).toBe("l");
    expect(thrown(() => leaseOrRefusal("acme", outcome({ outcome: "busy", retryAfterS: 7 })))).toMatchObject({
      status: 409,
      detail: { code: "group_busy", retry_after: 7, message: expect.stringMatching(/retry in 7 s/) },
    });
    expect(thrown(() => leaseOrRefusal("acme", outcome({ outcome: "renamed", groupSlug: "acme-co" })))).toMatchObject({
      status: 409,
      detail: { code: "group_renamed_during_registration", group_slug: "acme-co" },
    });
    const deleted = thrown(() => leaseOrRefusal("acme", outcome({ outcome: "deleted" })));
    expect(deleted.status).toBe(404);
    expect(deleted.message).toMatch(/deleted while the registration waited/);
    expect(thrown(() => leaseOrRefusal("acme", outcome({ outcome: "not_found" }))).status).toBe(404);
  });

  it("at the end of the write: renamed or deleted during it, or the lease lost to a change", () => {
    expect(() => confirmedOrRefusal("acme", outcome({ outcome: "held" }))).not.toThrow();
    expect(thrown(() => confirmedOrRefusal("acme", outcome({ outcome: "renamed", groupSlug: "acme-co" })))).toMatchObject({
      status: 409,
      detail: { code: "group_renamed_during_registration", group_slug: "acme-co" },
    });
    expect(thrown(() => confirmedOrRefusal("acme", outcome({ outcome: "deleted" })))).toMatchObject({
      status: 409,
      detail: { code: "group_deleted_during_registration" },
    });
    expect(thrown(() => confirmedOrRefusal("acme", outcome({ outcome: "busy", retryAfterS: 3 })))).toMatchObject({ status: 409, detail: { code: "group_busy" } });
  });
});

let databaseUrl: string;
let prefix: string;
let identity: TestIdentity;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof AppsBuildsService>>;
let db: pg.Client;

const member = (group: string): Caller => makeCaller({ kind: "api_key", principalId: `k-${group}`, scope: "deploy", visibleGroups: [group], selectedGroup: group });
const repo = (name: string) => `https://example.com/${name}.git`;


const appsNamed = (appName: string) => service.ctx.read((em) => em.find(App, { appName: { $like: `${appName}%` } }));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Holds the group lock exclusively, as a rename or delete would, through identity's RPC. */
async function holdExclusive(slug: string) {
  const r = await identity.client.acquireGroupLease({ groupSlug: slug, mode: "exclusive", holder: "test", ttlMs: 20_000, waitMs: 0 });
  expect(r.outcome).toBe("granted");
  return { release: () => identity.client.releaseGroupLease({ leaseId: r.lease!.id }) };
}

/** Holds back registrations of `appName` inside their transaction (after they took their lease). */
async function holdRegistrationsOf(appName: string) {
  await db.query("select pg_advisory_lock(hashtext($1))", [`apps.register.${appName}`]);
  return { release: () => db.query("select pg_advisory_unlock(hashtext($1))", [`apps.register.${appName}`]) };
}

async function liveSharedLeases(slug: string): Promise<number> {
  const r = await db.query<{ n: number }>(
    "select count(*)::int as n from identity.group_leases l join identity.groups g on g.id = l.group_id where g.slug = $1 and l.mode = 'shared' and l.expires_at > now()",
    [slug],
  );
  return r.rows[0]!.n;
}

/** What expiry does to a lease after its ttl: here, at once. */
async function lapseSharedLeases(slug: string): Promise<void> {
  await db.query("update identity.group_leases l set expires_at = now() - interval '1 second' from identity.groups g where g.id = l.group_id and g.slug = $1", [slug]);
}

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  const port = await freePort();
  identity = await startIdentity({
    databaseUrl,
    prefix,
    groups: ["shared", "busy", "renamed", "deleted", "slow-rename", "slow-delete", "moving", "caught"],
    appsBuildsUrl: `http://127.0.0.1:${port}`,
  });
  service = await build(
    loadConfig(appsBuildsEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: String(port), LOG_LEVEL: "silent", IDENTITY_URL: identity.url }),
  );
  client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${port}`, { timeoutMs: 20_000 });
  db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
});

afterAll(async () => {
  await db?.end();
  await service?.close();
  await identity?.service.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

describe("registration under the group lock", () => {
  it("does not wait for another registration in the group: the lease is shared", async () => {
    const other = await identity.client.acquireGroupLease({ groupSlug: "shared", mode: "shared", holder: "another registration", ttlMs: 20_000, waitMs: 0 });
    const started = Date.now();
    const [a, b] = await Promise.all([
      client.registerApp({ caller: member("shared"), appName: "one", repository: repo("one") }),
      client.registerApp({ caller: member("shared"), appName: "two", repository: repo("two") }),
    ]);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect([a.app?.groupSlug, b.app?.groupSlug]).toEqual(["shared", "shared"]);
    await identity.client.releaseGroupLease({ leaseId: other.lease!.id });
    // Each registration released its own lease.
    expect(await liveSharedLeases("shared")).toBe(0);
  });

  it("answers 409 group_busy with retry_after when a rename or delete keeps the lock past a few seconds, writing nothing", async () => {
    const lock = await holdExclusive("busy");
    try {
      const started = Date.now();
      const busy = await refusal(client.registerApp({ caller: member("busy"), appName: "blocked", repository: repo("blocked") }));
      expect(Date.now() - started).toBeGreaterThanOrEqual(2_900);
      expect(busy).toMatchObject({ status: 409, detail: { code: "group_busy" } });
      expect(busy.detail.retry_after).toBeGreaterThan(10);
      expect(busy.detail.retry_after).toBeLessThanOrEqual(20);
      // POST /api/builds registers an unknown app through the same code.
      const build = await refusal(client.triggerBuild({ caller: member("busy"), appName: "blocked", repository: repo("blocked"), skipPreflight: true }));
      expect(build).toMatchObject({ status: 409, detail: { code: "group_busy" } });
      expect(await appsNamed("blocked")).toEqual([]);
    } finally {
      await lock.release();
    }
    expect((await client.registerApp({ caller: member("busy"), appName: "blocked", repository: repo("blocked") })).app?.groupSlug).toBe("busy");
  });

  it("answers 409 group_renamed_during_registration with the current slug when the group was renamed while it waited", async () => {
    const lock = await holdExclusive("renamed");
    const rename = identity.client.updateGroup({ caller: operator, slug: "renamed", newSlug: "renamed-2" });
    await sleep(200);
    const registration = refusal(client.registerApp({ caller: member("renamed"), appName: "waiter", repository: repo("waiter") }));
    await sleep(300);
    await lock.release();
    await rename;
    expect(await registration).toMatchObject({ status: 409, detail: { code: "group_renamed_during_registration", group_slug: "renamed-2" } });
    expect(await appsNamed("waiter")).toEqual([]);
  });

  it("answers 404 when the group was deleted while it waited, writing nothing", async () => {
    const lock = await holdExclusive("deleted");
    const deletion = identity.client.deleteGroup({ caller: operator, slug: "deleted" });
    await sleep(200);
    const registration = refusal(client.registerApp({ caller: member("deleted"), appName: "orphan", repository: repo("orphan") }));
    await sleep(300);
    await lock.release();
    await deletion;
    const r = await registration;
    expect(r.status).toBe(404);
    expect(String(r.detail)).toMatch(/deleted while the registration waited/);
    expect(await appsNamed("orphan")).toEqual([]);
  });

  it("rolls the write back with 409 group_renamed_during_registration when its lease lapsed and the group was renamed meanwhile", async () => {
    const held = await holdRegistrationsOf("latecomer");
    const registration = refusal(client.registerApp({ caller: member("slow-rename"), appName: "latecomer", repository: repo("latecomer") }));
    try {
      await expect.poll(() => liveSharedLeases("slow-rename")).toBe(1);
      await lapseSharedLeases("slow-rename");
      await identity.client.updateGroup({ caller: operator, slug: "slow-rename", newSlug: "slow-rename-2" });
    } finally {
      await held.release();
    }
    expect(await registration).toMatchObject({ status: 409, detail: { code: "group_renamed_during_registration", group_slug: "slow-rename-2" } });
    expect(await appsNamed("latecomer")).toEqual([]);
  });

  it("rolls the write back with 409 group_deleted_during_registration when its lease lapsed and the group was deleted meanwhile", async () => {
    const held = await holdRegistrationsOf("stranded");
    const registration = refusal(client.registerApp({ caller: member("slow-delete"), appName: "stranded", repository: repo("stranded") }));
    try {
      await expect.poll(() => liveSharedLeases("slow-delete")).toBe(1);
      await lapseSharedLeases("slow-delete");
      // The registration's write is not committed: apps-builds reports no app, and the delete goes ahead.
      await identity.client.deleteGroup({ caller: operator, slug: "slow-delete" });
    } finally {
      await held.release();
    }
    expect(await registration).toMatchObject({ status: 409, detail: { code: "group_deleted_during_registration" } });
    expect(await appsNamed("stranded")).toEqual([]);
  });
});

describe("a renamed group's apps and builds", () => {
  it("follow the rename (group_renamed): listed, built and read under the new slug only", async () => {
    await client.registerApp({ caller: member("moving"), appName: "mover", repository: repo("mover") });
    const built = await client.triggerBuild({ caller: member("moving"), appName: "mover", repository: repo("mover"), skipPreflight: true });
    await identity.client.updateGroup({ caller: operator, slug: "moving", newSlug: "moved" });

    await expect.poll(async () => (await client.listApps({ caller: member("moved") })).items.map((a) => `${a.appName}@${a.groupSlug}`)).toEqual(["mover@moved"]);
    expect((await client.listApps({ caller: member("moving") })).total).toBe(0);
    expect((await client.getBuild({ caller: member("moved"), buildId: built.buildId })).groupSlug).toBe("moved");
    expect(await refusal(client.getApp({ caller: member("moving"), appName: "mover" }))).toMatchObject({ status: 404 });
    const rows = await service.ctx.read((em) => em.find(Build, { appName: "mover" }));
    expect(rows.map((b) => b.groupSlug)).toEqual(["moved"]);

    const after = await client.registerApp({ caller: member("moved"), appName: "mover", repository: repo("mover"), branch: "dev" });
    expect(after.app).toMatchObject({ appName: "mover", groupSlug: "moved", branch: "dev" });
  });

  it("are caught up with by a registration when the rename's event has not been handled here yet", async () => {
    await client.registerApp({ caller: member("caught"), appName: "laggard", repository: repo("laggard") });
    await identity.client.updateGroup({ caller: operator, slug: "caught", newSlug: "caught-2" });
    await expect.poll(async () => (await client.listApps({ caller: member("caught-2") })).total).toBe(1);
    // As if the event were still on its way: the row is back under the old slug.
    await service.ctx.write((em) => em.getConnection().execute("update apps set group_slug = 'caught' where app_name = 'laggard'", [], "run", em.getTransactionContext()));

    const branch = await client.registerApp({ caller: member("caught-2"), appName: "laggard", repository: repo("laggard"), branch: "dev" });
    expect(branch.app).toMatchObject({ appName: "laggard", groupSlug: "caught-2", branch: "dev", isProduction: false });
    expect((await appsNamed("laggard")).map((a) => `${a.branch}@${a.groupSlug}`).sort()).toEqual(["dev@caught-2", "main@caught-2"]);
  });
});
