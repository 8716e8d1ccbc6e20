/**
 * The group lock: its rules as plain functions, then its leases through identity's Connect API
 * against the real Postgres (shared and exclusive, waiting, the queue of exclusive requests,
 * expiry, confirmation after a rename or a delete, release).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { identityEnv, loadConfig } from "@platform/config";
import { createServiceClient, platformErrorOf } from "@platform/rpc";
import { IdentityService, type GroupLease } from "@platform/proto";
import { makeCaller } from "@platform/caller";
import { createTestDatabase, deleteBusStreams, dropDatabase, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { Group, GroupLease as GroupLeaseRow } from "../src/entities/index.ts";
import { blockingLeases, checkLeaseRequest, retryAfterSeconds, type LeaseView } from "../src/domain/group-lock.ts";

const at = (ms: number) => new Date(Date.UTC(2026, 0, 1) + ms);
const lease = (id: string, mode: string, o: { granted?: boolean; requested?: number; expires?: number } = {}): LeaseView => ({
  id,
  mode,
  requestedAt: at(o.requested ?? 0),
  grantedAt: o.granted === false ? null : at(o.requested ?? 0),
  expiresAt: at(o.expires ?? 10_000),
});

describe("lock rules", () => {
  const now = at(1_000);

  it("lets shared leases share the group", () => {
    expect(blockingLeases("shared", [lease("a", "shared"), lease("b", "shared")], now)).toEqual([]);
  });

  it("keeps a shared request out while an exclusive lease is held or queued", () => {
    const held = lease("x", "exclusive");
    const queued = lease("q", "exclusive", { granted: false });
    expect(blockingLeases("shared", [lease("a", "shared"), held], now)).toEqual([held]);
    expect(blockingLeases("shared", [queued], now)).toEqual([queued]);
  });

  it("keeps an exclusive request out while any lease is held", () => {
    const shared = lease("a", "shared");
    expect(blockingLeases("exclusive", [shared], now)).toEqual([shared]);
    expect(blockingLeases("exclusive", [lease("x", "exclusive")], now)).toHaveLength(1);
  });

  it("queues exclusive requests in the order they came", () => {
    const first = lease("q1", "exclusive", { granted: false, requested: 100 });
    const second = lease("q2", "exclusive", { granted: false, requested: 200 });
    expect(blockingLeases("exclusive", [first, second], now, first)).toEqual([]);
    expect(blockingLeases("exclusive", [first, second], now, second)).toEqual([first]);
    // A request not queued yet waits behind every queued one.
    expect(blockingLeases("exclusive", [first], now)).toEqual([first]);
  });

  it("ignores expired leases: a crashed holder frees the group", () => {
    expect(blockingLeases("exclusive", [lease("a", "shared", { expires: 999 }), lease("x", "exclusive", { expires: 1_000 })], now)).toEqual([]);
  });

  it("tells a waiter to retry once the last blocking lease has expired, at least 1 s", () => {
    expect(retryAfterSeconds([lease("a", "shared", { expires: 3_500 }), lease("b", "shared", { expires: 9_001 })], now)).toBe(9);
    expect(retryAfterSeconds([lease("a", "shared", { expires: 1_001 })], now)).toBe(1);
  });

  it("refuses a request outside its bounds", () => {
    const ok = { groupSlug: "acme", mode: "shared", holder: "test", ttlMs: 1000, waitMs: 0 };
    expect(checkLeaseRequest(ok)).toBe("shared");
    for (const bad of [{ mode: "both" }, { ttlMs: 0 }, { ttlMs: 60_001 }, { waitMs: -1 }, { waitMs: 10_001 }, { holder: " " }]) {
      expect(() => checkLeaseRequest({ ...ok, ...bad })).toThrow();
    }
  });
});

let databaseUrl: string;
let prefix: string;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof IdentityService>>;
const root = makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, platformRoot: true });

const acquire = (groupSlug: string, mode: string, o: { ttlMs?: number; waitMs?: number } = {}) =>
  client.acquireGroupLease({ groupSlug, mode, holder: `test ${mode}`, ttlMs: o.ttlMs ?? 10_000, waitMs: o.waitMs ?? 0 });
const confirm = (l: GroupLease | undefined, ttlMs = 10_000) => client.confirmGroupLease({ lease: l, ttlMs });
const release = (l: GroupLease | undefined) => client.releaseGroupLease({ leaseId: l?.id ?? "" });
const liveLeases = (slug: string) =>
  service.ctx.read(async (em) => {
    const group = await em.findOneOrFail(Group, { slug });
    return em.find(GroupLeaseRow, { groupId: group.id, expiresAt: { $gt: new Date() } });
  });

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  service = await build(loadConfig(identityEnv, { DATABASE_URL: databaseUrl, NATS_URL: testNatsUrl(), BUS_PREFIX: prefix, RPC_PORT: "0", LOG_LEVEL: "silent" }));
  client = createServiceClient(IdentityService, `http://127.0.0.1:${service.rpc.port}`, { timeoutMs: 15_000 });
  for (const slug of ["shared", "excl", "queue", "expiry", "moved", "gone", "lapsed", "bounds"]) await client.createGroup({ caller: root, slug });
});

afterAll(async () => {
  await service?.close();
  await dropDatabase(databaseUrl);
  await deleteBusStreams(prefix);
});

describe("leases through the RPC", () => {
  it("grants shared leases side by side, with the group's id and slug", async () => {
    const a = await acquire("shared", "shared");
    const b = await acquire("shared", "shared");
    expect(a).toMatchObject({ outcome: "granted", lease: { groupSlug: "shared", mode: "shared", formerSlugs: [] } });
    expect(b.outcome).toBe("granted");
    expect(b.lease!.groupId).toBe(a.lease!.groupId);
    expect(Number(a.lease!.expiresAtMs)).toBeGreaterThan(Date.now());
    await release(a.lease);
    await release(b.lease);
    expect(await liveLeases("shared")).toEqual([]);
  });

  it("answers busy, with the seconds to wait, while a conflicting lease is held past the wait", async () => {
    const held = await acquire("excl", "exclusive", { ttlMs: 20_000 });
    const started = Date.now();
    const shared = await acquire("excl", "shared", { waitMs: 300 });
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    expect(shared).toMatchObject({ outcome: "busy" });
    expect(shared.retryAfterS).toBeGreaterThan(15);
    expect(shared.retryAfterS).toBeLessThanOrEqual(20);
    expect((await acquire("excl", "exclusive")).outcome).toBe("busy");
    await release(held.lease);
    const after = await acquire("excl", "shared");
    expect(after.outcome).toBe("granted");
    // ...and the exclusive request that gave up left nothing queued behind.
    expect((await liveLeases("excl")).map((l) => l.mode)).toEqual(["shared"]);
    await release(after.lease);
  });

  it("grants a waiting request as soon as the conflicting lease is released", async () => {
    const held = await acquire("excl", "shared");
    const waiting = acquire("excl", "exclusive", { waitMs: 5_000 });
    await new Promise((r) => setTimeout(r, 300));
    await release(held.lease);
    const granted = await waiting;
    expect(granted.outcome).toBe("granted");
    await release(granted.lease);
  });

  it("queues an exclusive request: shared requests arriving after it wait behind it", async () => {
    const registration = await acquire("queue", "shared");
    const rename = acquire("queue", "exclusive", { waitMs: 5_000 });
    await new Promise((r) => setTimeout(r, 300));
    expect((await acquire("queue", "shared")).outcome).toBe("busy");
    await release(registration.lease);
    const granted = await rename;
    expect(granted.outcome).toBe("granted");
    await release(granted.lease);
    expect((await acquire("queue", "shared")).outcome).toBe("granted");
  });

  it("expires: a holder that never releases frees the group after its ttl", async () => {
    await acquire("expiry", "exclusive", { ttlMs: 300 });
    expect((await acquire("expiry", "shared")).outcome).toBe("busy");
    await new Promise((r) => setTimeout(r, 400));
    const after = await acquire("expiry", "shared");
    expect(after.outcome).toBe("granted");
    await release(after.lease);
  });

  it("says renamed, with the current slug, when the group was renamed while the request waited", async () => {
    const held = await acquire("moved", "shared");
    const rename = client.updateGroup({ caller: root, slug: "moved", newSlug: "moved-2" });
    await new Promise((r) => setTimeout(r, 300));
    const waiting = acquire("moved", "shared", { waitMs: 5_000 });
    await new Promise((r) => setTimeout(r, 300));
    // The registration holding its lease confirms it before its commit: still held, nothing moved yet.
    expect((await confirm(held.lease)).outcome).toBe("held");
    await release(held.lease);
    await rename;
    expect(await waiting).toMatchObject({ outcome: "renamed", groupSlug: "moved-2" });
    expect(await confirm(held.lease)).toMatchObject({ outcome: "renamed", groupSlug: "moved-2" });
    const now = await acquire("moved-2", "shared");
    expect(now.lease).toMatchObject({ groupSlug: "moved-2", formerSlugs: ["moved"] });
    await release(now.lease);
    // A request naming the slug the rename retired (read just before it) is told the current one.
    expect(await acquire("moved", "shared")).toMatchObject({ outcome: "renamed", groupSlug: "moved-2" });
  });

  it("says deleted when the group was deleted while the request waited or held its lease", async () => {
    const held = await acquire("gone", "exclusive", { ttlMs: 20_000 });
    const waiting = acquire("gone", "shared", { waitMs: 5_000 });
    await new Promise((r) => setTimeout(r, 300));
    await service.ctx.write(async (em) => em.remove(await em.findOneOrFail(Group, { slug: "gone" })));
    expect((await waiting).outcome).toBe("deleted");
    expect((await confirm(held.lease)).outcome).toBe("deleted");
    expect((await acquire("gone", "shared")).outcome).toBe("not_found");
  });

  it("takes a lapsed lease again when nothing conflicts, and reports busy when a change took the group meanwhile", async () => {
    const mine = await acquire("lapsed", "shared", { ttlMs: 200 });
    await new Promise((r) => setTimeout(r, 300));
    const again = await confirm(mine.lease);
    expect(again).toMatchObject({ outcome: "held", lease: { id: mine.lease!.id, groupSlug: "lapsed" } });
    expect(Number(again.lease!.expiresAtMs)).toBeGreaterThan(Date.now() + 5_000);

    const short = await acquire("lapsed", "shared", { ttlMs: 200 });
    await release(again.lease);
    await new Promise((r) => setTimeout(r, 300));
    const change = await acquire("lapsed", "exclusive", { ttlMs: 5_000 });
    expect(change.outcome).toBe("granted");
    const lost = await confirm(short.lease);
    expect(lost.outcome).toBe("busy");
    expect(lost.retryAfterS).toBeGreaterThan(0);
    await release(change.lease);
  });

  it("refuses bad requests with 422 and an unknown slug with not_found", async () => {
    const status = (p: Promise<unknown>) => p.then(() => 200, (err: unknown) => platformErrorOf(err)?.status);
    expect(await status(acquire("bounds", "sideways"))).toBe(422);
    expect(await status(client.acquireGroupLease({ groupSlug: "bounds", mode: "shared", holder: "t", ttlMs: 0, waitMs: 0 }))).toBe(422);
    expect(await status(confirm({ id: "nope", groupId: "nope", groupSlug: "bounds", mode: "shared" } as GroupLease))).toBe(422);
    expect((await acquire("no-such-group", "shared")).outcome).toBe("not_found");
  });
});
