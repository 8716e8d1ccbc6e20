/**
 * Renaming and deleting groups, against the real Postgres and NATS, with a real apps-builds beside
 * identity (a delete asks it whether the group still owns apps; a registration takes the group
 * lock from identity): operator only, every refusal, the group keeping its id, its keys and
 * members following the new slug, the old slug reserved to it, the audit log and the events.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { appsBuildsEnv, identityEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService, IdentityService } from "@platform/proto";
import { makeCaller } from "@platform/caller";
import { connectBus, subjects, subscribe, type Bus, type EventEnvelope } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createTestDatabase, deleteBusStreams, dropDatabase, freePorts, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { build as buildAppsBuilds } from "../../apps-builds/src/app.ts";
import { AuditEntry } from "@platform/db";
import { Group, Membership } from "../src/entities/index.ts";
import { addMembership, createUser, mintSession } from "../src/domain/users.ts";

const logger = createLogger({ service: "identity-groups-test", level: "silent", pretty: false });

let databaseUrl: string;
let prefix: string;
let identity: RunningService;
let appsBuilds: RunningService;
let client: ReturnType<typeof createServiceClient<typeof IdentityService>>;
let apps: ReturnType<typeof createServiceClient<typeof AppsBuildsService>>;
let bus: Bus;
const events: Array<{ subject: string; event: EventEnvelope }> = [];

const root = makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, platformRoot: true });
const tenant = (group: string) => makeCaller({ kind: "api_key", principalId: `k-${group}`, scope: "admin", visibleGroups: [group], selectedGroup: group });


const groupRow = (slug: string) => identity.ctx.read((em) => em.findOne(Group, { slug }));
const eventsOf = (subject: string) => events.filter((e) => e.subject === subject).map((e) => e.event.data);

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  const [identityPort, appsPort] = await freePorts(2);
  const common = { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, LOG_LEVEL: "silent" };
  identity = await build(loadConfig(identityEnv, { ...common, RPC_PORT: String(identityPort), APPS_BUILDS_URL: `http://127.0.0.1:${appsPort}` }));
  appsBuilds = await buildAppsBuilds(loadConfig(appsBuildsEnv, { ...common, RPC_PORT: String(appsPort), IDENTITY_URL: `http://127.0.0.1:${identityPort}` }));
  client = createServiceClient(IdentityService, `http://127.0.0.1:${identityPort}`, { timeoutMs: 15_000 });
  apps = createServiceClient(AppsBuildsService, `http://127.0.0.1:${appsPort}`, { timeoutMs: 15_000 });
  bus = await connectBus({ url: testNatsUrl(), name: "identity-groups-test", prefix });
  for (const subject of [subjects.events.groupRenamed, subjects.events.groupDeleted, subjects.events.groupUpdated]) {
    subscribe(bus, subject, (event) => void events.push({ subject, event }), logger);
  }
  for (const slug of ["acme", "globex", "initech"]) await client.createGroup({ caller: root, slug, displayName: slug.toUpperCase() });
});

afterAll(async () => {
  await bus?.close();
  await appsBuilds?.close();
  await identity?.close();
  await dropDatabase(databaseUrl);
  await deleteBusStreams(prefix);
});

describe("creating a group", () => {
  it("answers 409 group_exists to every create of one slug but the first, however many come at once", async () => {
    const results = await Promise.allSettled(Array.from({ length: 6 }, () => client.createGroup({ caller: root, slug: "raced" })));
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    for (const r of results) {
      if (r.status === "rejected") expect(await refusal(Promise.reject(r.reason))).toMatchObject({ status: 409, detail: { code: "group_exists" } });
    }
  });
});

describe("renaming a group", () => {
  it("is for platform operators only", async () => {
    expect(await refusal(client.updateGroup({ caller: tenant("acme"), slug: "acme", newSlug: "acme-co" }))).toMatchObject({ status: 403 });
    expect(await refusal(client.deleteGroup({ caller: tenant("acme"), slug: "acme" }))).toMatchObject({ status: 403 });
  });

  it("refuses an unknown group (404), a bad slug (422) and a slug in use (409 group_exists)", async () => {
    expect(await refusal(client.updateGroup({ caller: root, slug: "nope", newSlug: "nope-2" }))).toMatchObject({ status: 404 });
    expect(await refusal(client.updateGroup({ caller: root, slug: "nope", displayName: "x" }))).toMatchObject({ status: 404 });
    for (const bad of ["Acme", "-acme", "acme_co", "a".repeat(64), ""]) {
      expect(await refusal(client.updateGroup({ caller: root, slug: "acme", newSlug: bad }))).toMatchObject({ status: 422 });
    }
    expect(await refusal(client.updateGroup({ caller: root, slug: "acme", displayName: "x".repeat(201) }))).toMatchObject({ status: 422 });
    expect(await refusal(client.updateGroup({ caller: root, slug: "acme", newSlug: "globex" }))).toMatchObject({
      status: 409,
      detail: { code: "group_exists" },
    });
    expect((await groupRow("acme"))?.slug).toBe("acme");
  });

  it("changes the display name alone without a rename", async () => {
    const g = await client.updateGroup({ caller: root, slug: "initech", displayName: "Initech Corp" });
    expect(g).toMatchObject({ slug: "initech", displayName: "Initech Corp" });
    const audits = await identity.ctx.read((em) => em.find(AuditEntry, { action: "group.update", target: "initech" }));
    expect(audits[0]?.details).toMatchObject({ display_name: "Initech Corp", previous_display_name: "INITECH" });
    await expect.poll(() => eventsOf(subjects.events.groupUpdated)).toContainEqual(expect.objectContaining({ slug: "initech", display_name: "Initech Corp" }));
    // An empty one is the default, as at creation: the slug.
    expect(await client.updateGroup({ caller: root, slug: "initech", displayName: " " })).toMatchObject({ slug: "initech", displayName: "initech" });
    await client.updateGroup({ caller: root, slug: "initech", displayName: "Initech Corp" });
  });

  it("renames: same id, keys and members follow the new slug, audited and announced", async () => {
    const before = await groupRow("acme");
    const { secret } = await client.createKey({ caller: root, name: "ci", scope: "deploy", group: "acme" });
    const member = await identity.ctx.write(async (em) => {
      const user = await createUser(em, { email: "wile@example.com" });
      await em.flush();
      await addMembership(em, user.id, "acme", "deployer");
      return { user, ...mintSession(em, user.id, "browser") };
    });

    const renamed = await client.updateGroup({ caller: root, slug: "acme", newSlug: "acme-co", displayName: "Acme Co" });
    expect(renamed).toMatchObject({ slug: "acme-co", displayName: "Acme Co", createdAt: before!.createdAt.toISOString() });
    expect((await groupRow("acme-co"))?.id).toBe(before!.id);
    expect(await groupRow("acme")).toBeNull();

    expect((await client.verifyCredential({ credential: secret })).principal).toMatchObject({ keyGroup: "acme-co" });
    const { principal } = await client.verifyCredential({ credential: member.token });
    expect(principal?.memberships.map((m) => m.groupSlug)).toContain("acme-co");
    expect(principal?.memberships.map((m) => m.groupSlug)).not.toContain("acme");

    const audits = await identity.ctx.read((em) => em.find(AuditEntry, { action: "group.rename" }));
    expect(audits).toHaveLength(1);
    expect(audits[0]).toMatchObject({ actor: "api_key:root", target: "acme-co", groupSlug: "acme-co", details: { previous_slug: "acme" } });
    await expect.poll(() => eventsOf(subjects.events.groupRenamed)).toContainEqual({
      group_id: before!.id,
      slug: "acme-co",
      previous_slug: "acme",
      display_name: "Acme Co",
    });
  });

  it("keeps the old slug for the group: no other group may take it, the group itself may take it back", async () => {
    expect(await refusal(client.createGroup({ caller: root, slug: "acme" }))).toMatchObject({ status: 409, detail: { code: "group_slug_reserved" } });
    expect(await refusal(client.updateGroup({ caller: root, slug: "globex", newSlug: "acme" }))).toMatchObject({ status: 409, detail: { code: "group_slug_reserved" } });
    await client.updateGroup({ caller: root, slug: "acme-co", newSlug: "acme" });
    const back = await client.acquireGroupLease({ groupSlug: "acme", mode: "shared", holder: "test", ttlMs: 1000, waitMs: 0 });
    expect(back.lease).toMatchObject({ groupSlug: "acme", formerSlugs: ["acme-co"] });
    await client.releaseGroupLease({ leaseId: back.lease!.id });
    // acme-co is now the former slug, reserved in its turn.
    expect(await refusal(client.createGroup({ caller: root, slug: "acme-co" }))).toMatchObject({ status: 409, detail: { code: "group_slug_reserved" } });
  });

  it("answers group_busy with the seconds to wait while a registration holds the group lock", async () => {
    const registration = await client.acquireGroupLease({ groupSlug: "globex", mode: "shared", holder: "test registration", ttlMs: 20_000, waitMs: 0 });
    try {
      const busy = await refusal(client.updateGroup({ caller: root, slug: "globex", newSlug: "globex-2" }));
      expect(busy).toMatchObject({ status: 409, detail: { code: "group_busy" } });
      expect(busy.detail.retry_after).toBeGreaterThan(10);
      expect(busy.detail.message).toMatch(/retry in \d+ s/);
      expect(await groupRow("globex")).not.toBeNull();
    } finally {
      await client.releaseGroupLease({ leaseId: registration.lease!.id });
    }
  });
});

describe("deleting a group", () => {
  it("refuses an unknown group (404) and a user's personal group (409 personal_group)", async () => {
    expect(await refusal(client.deleteGroup({ caller: root, slug: "nope" }))).toMatchObject({ status: 404 });
    const personal = await identity.ctx.write(async (em) => {
      const user = await createUser(em, { email: "road@example.com" });
      await em.flush();
      return (await em.findOneOrFail(Group, { id: user.personalGroupId! })).slug;
    });
    expect(await refusal(client.deleteGroup({ caller: root, slug: personal }))).toMatchObject({ status: 409, detail: { code: "personal_group" } });
    expect(await groupRow(personal)).not.toBeNull();
  });

  it("refuses while the group owns apps, under any slug it had, and deletes it once they are gone", async () => {
    await client.createGroup({ caller: root, slug: "hooli" });
    const { secret } = await client.createKey({ caller: root, name: "ci", scope: "deploy", group: "hooli" });
    await apps.registerApp({ caller: tenant("hooli"), appName: "hooli-web", repository: "https://example.com/hooli/web.git" });
    await client.updateGroup({ caller: root, slug: "hooli", newSlug: "hooli-xyz" });
    const id = (await groupRow("hooli-xyz"))!.id;

    const refused = await refusal(client.deleteGroup({ caller: root, slug: "hooli-xyz" }));
    expect(refused).toMatchObject({ status: 409, detail: { code: "group_has_apps", app_count: 1 } });
    expect(await groupRow("hooli-xyz")).not.toBeNull();

    await expect.poll(async () => (await apps.listApps({ caller: tenant("hooli-xyz") })).total).toBe(1);
    await apps.deleteApp({ caller: tenant("hooli-xyz"), appName: "hooli-web" });
    await client.deleteGroup({ caller: root, slug: "hooli-xyz" });

    expect(await groupRow("hooli-xyz")).toBeNull();
    expect(await refusal(client.verifyCredential({ credential: secret }))).toMatchObject({ status: 401 });
    expect(await identity.ctx.read((em) => em.find(Membership, { groupId: id }))).toEqual([]);
    const audit = await identity.ctx.read((em) => em.findOneOrFail(AuditEntry, { action: "group.delete" }));
    expect(audit).toMatchObject({ target: "hooli-xyz", details: { group_id: id, former_slugs: ["hooli"] } });
    await expect.poll(() => eventsOf(subjects.events.groupDeleted)).toContainEqual({ group_id: id, slugs: ["hooli-xyz", "hooli"], deleted_at: expect.any(String) });
    // Its slugs are free again: nothing of the group is left to reach a new one.
    expect(await client.createGroup({ caller: root, slug: "hooli" })).toMatchObject({ slug: "hooli" });
  });
});
