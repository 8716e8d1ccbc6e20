/**
 * identity against the real Postgres and NATS: credentials, sessions, keys, root key seeding,
 * revocation events and the audit log, through its Connect API.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { identityEnv, loadConfig } from "@platform/config";
import { createServiceClient } from "@platform/rpc";
import { IdentityService } from "@platform/proto";
import { makeCaller, type Caller } from "@platform/caller";
import { connectBus, subjects, subscribe, type Bus, type EventEnvelope } from "@platform/bus";
import { createLogger } from "@platform/logger";
import { createTestDatabase, deleteBusStreams, dropDatabase, generateRootKey, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { AuditEntry } from "@platform/db";
import { ApiKey, Session, User } from "../src/entities/index.ts";
import { addMembership, createUser, mintSession } from "../src/domain/users.ts";
import { verifyCredential } from "../src/domain/verification.ts";
import { SESSION_POLICY } from "../src/domain/sessions.ts";

const DAY = 24 * 3600 * 1000;
const logger = createLogger({ service: "identity-test", level: "silent", pretty: false });

let databaseUrl: string;
let prefix: string;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof IdentityService>>;
let bus: Bus;
const rootKey = generateRootKey();
const events: EventEnvelope[] = [];

function config(overrides: Record<string, string> = {}) {
  return loadConfig(identityEnv, {
    DATABASE_URL: databaseUrl,
    NATS_URL: testNatsUrl(),
    BUS_PREFIX: prefix,
    RPC_PORT: "0",
    LOG_LEVEL: "silent",
    PLATFORM_ROOT_KEY: rootKey,
    ...overrides,
  });
}


const root = () =>
  makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, platformRoot: true });

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  service = await build(config());
  client = createServiceClient(IdentityService, `http://127.0.0.1:${service.rpc.port}`);
  bus = await connectBus({ url: testNatsUrl(), name: "identity-test", prefix });
  subscribe(bus, subjects.events.credentialRevoked, (e) => void events.push(e), logger);
});

afterAll(async () => {
  await bus?.close();
  await service?.close();
  await dropDatabase(databaseUrl);
  await deleteBusStreams(prefix);
});

describe("root key", () => {
  it("is seeded from PLATFORM_ROOT_KEY and verifies as the platform root", async () => {
    const { principal } = await client.verifyCredential({ credential: rootKey });
    expect(principal).toMatchObject({ kind: "api_key", keyKind: "root", scope: "admin", keyGroup: "" });
  });

  it("is seeded once however often the service starts with the same key", async () => {
    const again = await build(config());
    await again.close();
    const roots = await service.ctx.read((em) => em.find(ApiKey, { kind: "root" }));
    expect(roots).toHaveLength(1);
    const audits = await service.ctx.read((em) => em.find(AuditEntry, { action: { $like: "root_key.%" } }));
    expect(audits.map((a) => a.action)).toEqual(["root_key.seed"]);
  });

  it("rotates when the secret changes: the old key stops working", async () => {
    const next = generateRootKey();
    const rotated = await build(config({ PLATFORM_ROOT_KEY: next }));
    await rotated.close();
    expect((await refusal(client.verifyCredential({ credential: rootKey })))?.status).toBe(401);
    const { principal } = await client.verifyCredential({ credential: next });
    expect(principal?.keyKind).toBe("root");
    const live = await service.ctx.read((em) => em.find(ApiKey, { kind: "root", revokedAt: null }));
    expect(live).toHaveLength(1);
  });

  it("refuses a value that is not a pf_k1_ key", async () => {
    await expect(build(config({ PLATFORM_ROOT_KEY: "not-a-key" }))).rejects.toThrow(/PLATFORM_ROOT_KEY must be a pf_k1_ key/);
  });
});

describe("API keys", () => {
  let acme: Caller;

  beforeAll(async () => {
    await client.createGroup({ caller: root(), slug: "acme", displayName: "Acme" });
    await client.createGroup({ caller: root(), slug: "globex" });
    acme = makeCaller({ kind: "api_key", principalId: "k", scope: "deploy", visibleGroups: ["acme"], selectedGroup: "acme" });
  });

  it("stores only the prefix and SHA-256 of a key, and shows the key once", async () => {
    const r = await client.createKey({ caller: root(), name: "ci", scope: "deploy", group: "acme" });
    expect(r.secret).toMatch(/^pf_k1_[A-Za-z0-9_-]{43}$/);
    expect(r.secret.startsWith(r.key!.prefix)).toBe(true);
    const row = await service.ctx.read((em) => em.findOneOrFail(ApiKey, { id: r.key!.id }));
    expect(row.hash).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(row)).not.toContain(r.secret);
    const listed = await client.listKeys({ caller: root() });
    expect(JSON.stringify(listed)).not.toContain(r.secret);
    expect(JSON.stringify(listed)).not.toContain(row.hash);
  });

  it("records last_used_at on every successful use", async () => {
    const r = await client.createKey({ caller: root(), name: "use", scope: "read", group: "acme" });
    await client.verifyCredential({ credential: r.secret });
    const first = await service.ctx.read((em) => em.findOneOrFail(ApiKey, { id: r.key!.id }));
    expect(first.lastUsedAt).toBeInstanceOf(Date);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await client.verifyCredential({ credential: r.secret });
    const second = await service.ctx.read((em) => em.findOneOrFail(ApiKey, { id: r.key!.id }));
    expect(second.lastUsedAt!.getTime()).toBeGreaterThan(first.lastUsedAt!.getTime());
  });

  it("answers the same 401 for a wrong prefix, an unknown key and a revoked key, and announces the revocation", async () => {
    const r = await client.createKey({ caller: root(), name: "doomed", scope: "read", group: "acme" });
    await client.revokeKey({ caller: root(), id: r.key!.id });
    for (const credential of ["xyz", "pf_k1_unknown", r.secret]) {
      const err = await refusal(client.verifyCredential({ credential }));
      expect(err).toMatchObject({ status: 401, detail: "Invalid or revoked API key" });
    }
    await expect.poll(() => events.map((e) => e.data.id)).toContain(r.key!.id);
  });

  it("lets a tenant mint only for its own group and at most its own scope", async () => {
    const ok = await client.createKey({ caller: acme, name: "reader", scope: "read" });
    expect(ok.key?.groupSlug).toBe("acme");
    expect(await refusal(client.createKey({ caller: acme, name: "x", scope: "admin" }))).toMatchObject({ status: 403 });
    expect(await refusal(client.createKey({ caller: acme, name: "x", scope: "read", group: "globex" }))).toMatchObject({ status: 404 });
    expect(await refusal(client.createKey({ caller: acme, name: "x", scope: "read", platform: true }))).toMatchObject({ status: 403 });
    expect(await refusal(client.createKey({ caller: acme, name: "", scope: "read" }))).toMatchObject({ status: 422 });
    expect((await client.createKey({ caller: acme, name: "😀".repeat(100), scope: "read" })).key).toBeTruthy();
    expect(await refusal(client.createKey({ caller: acme, name: "😀".repeat(101), scope: "read" }))).toMatchObject({ status: 422 });
    expect(await refusal(client.createKey({ caller: acme, name: "x", scope: "owner" }))).toMatchObject({ status: 422 });
  });

  it("hides another group's keys: listing shows none and revoking answers 404", async () => {
    const globexKey = await client.createKey({ caller: root(), name: "g", scope: "read", group: "globex" });
    const listed = await client.listKeys({ caller: acme });
    expect(listed.items.every((k) => k.groupSlug === "acme")).toBe(true);
    expect(await refusal(client.revokeKey({ caller: acme, id: globexKey.key!.id }))).toMatchObject({ status: 404 });
    expect(await refusal(client.revokeKey({ caller: acme, id: "not-a-uuid" }))).toMatchObject({ status: 404 });
  });

  it("refuses to revoke the root key", async () => {
    const rootRow = await service.ctx.read((em) => em.findOneOrFail(ApiKey, { kind: "root", revokedAt: null }));
    const err = await refusal(client.revokeKey({ caller: root(), id: rootRow.id }));
    expect(err).toMatchObject({ status: 409, detail: { code: "root_key_protected" } });
  });

  it("audits group and key changes", async () => {
    const actions = (await service.ctx.read((em) => em.find(AuditEntry, {}))).map((a) => a.action);
    expect(actions).toEqual(expect.arrayContaining(["group.create", "key.create", "key.revoke"]));
  });

  it("refuses duplicate and malformed group slugs", async () => {
    expect(await refusal(client.createGroup({ caller: root(), slug: "acme" }))).toMatchObject({ status: 409, detail: { code: "group_exists" } });
    expect(await refusal(client.createGroup({ caller: root(), slug: "Not A Slug" }))).toMatchObject({ status: 422 });
    expect(await refusal(client.createGroup({ caller: acme, slug: "mine" }))).toMatchObject({ status: 403 });
  });
});

describe("sessions", () => {
  async function newSession(kind: "browser" | "cli", createdAt: Date, email = `u${Math.random().toString(16).slice(2)}@example.com`) {
    return service.ctx.write(async (em) => {
      const user = await createUser(em, { email });
      await em.flush();
      await addMembership(em, user.id, "acme", "deployer");
      return { user, ...mintSession(em, user.id, kind, createdAt) };
    });
  }

  it("resolves the user, memberships and the personal group, and extends the idle window on use", async () => {
    const { token, session, user } = await newSession("cli", new Date(Date.now() - 3600_000));
    const { principal } = await client.verifyCredential({ credential: token });
    expect(principal?.user?.email).toBe(user.email);
    expect(principal?.memberships.map((m) => [m.groupSlug, m.role])).toContainEqual(["acme", "deployer"]);
    expect(principal?.user?.personalGroup).toMatch(/^u[0-9a-f]+-[0-9a-f]{6}$/);
    const row = await service.ctx.read((em) => em.findOneOrFail(Session, { id: session.id }));
    expect(row.idleExpiresAt.getTime()).toBeGreaterThan(Date.now() + SESSION_POLICY.idleMs.cli - 60_000);
  });

  it("idles out a CLI session after 24 hours and a browser session after 30 days", async () => {
    const cli = await newSession("cli", new Date(Date.now() - 25 * 3600_000));
    expect(await refusal(client.verifyCredential({ credential: cli.token }))).toMatchObject({ status: 401 });
    const browser = await newSession("browser", new Date(Date.now() - 29 * DAY));
    await expect(client.verifyCredential({ credential: browser.token })).resolves.toBeTruthy();
    const stale = await newSession("browser", new Date(Date.now() - 31 * DAY));
    expect(await refusal(client.verifyCredential({ credential: stale.token }))).toMatchObject({ status: 401 });
  });

  it("ends every session at the 90-day cap however recently it was used", async () => {
    const { token, session } = await newSession("browser", new Date(Date.now() - 91 * DAY));
    await service.ctx.write(async (em) => {
      const row = await em.findOneOrFail(Session, { id: session.id });
      row.idleExpiresAt = new Date(Date.now() + DAY);
    });
    expect(await refusal(client.verifyCredential({ credential: token }))).toMatchObject({ status: 401 });
    const nearCap = await newSession("browser", new Date(Date.now() - 89 * DAY));
    await service.ctx.write(async (em) => {
      const row = await em.findOneOrFail(Session, { id: nearCap.session.id });
      row.idleExpiresAt = new Date(Date.now() + DAY);
    });
    const at = new Date();
    const p = await service.ctx.write((em) => verifyCredential(em, nearCap.token, at));
    // The idle window never reaches past the absolute cap.
    expect(p.validUntilMs).toBe(nearCap.session.absoluteMaxAt.getTime());
  });

  it("refuses a disabled account with 403", async () => {
    const { token, user } = await newSession("browser", new Date());
    await service.ctx.write(async (em) => {
      const row = await em.findOneOrFail(User, { id: user.id });
      row.disabled = true;
    });
    expect(await refusal(client.verifyCredential({ credential: token }))).toMatchObject({ status: 403 });
  });

  it("records cached uses: TouchCredentials moves last_used_at and the idle window", async () => {
    const { session, user } = await newSession("cli", new Date(Date.now() - 20 * 3600_000));
    const usedAt = Date.now();
    await client.touchCredentials({ uses: [{ kind: "session", id: session.id, usedAtMs: BigInt(usedAt) }] });
    const row = await service.ctx.read((em) => em.findOneOrFail(Session, { id: session.id }));
    expect(row.lastUsedAt?.getTime()).toBe(usedAt);
    expect(row.idleExpiresAt.getTime()).toBe(usedAt + SESSION_POLICY.idleMs.cli);
    expect(user.id).toBeTruthy();
  });

  it("lists and revokes only the caller's own sessions", async () => {
    const a = await newSession("browser", new Date());
    const b = await newSession("browser", new Date());
    const callerA = makeCaller({ kind: "session", principalId: a.session.id, userId: a.user.id, scope: "deploy" });
    const listed = await client.listSessions({ caller: callerA });
    expect(listed.items.map((s) => s.id)).toEqual([a.session.id]);
    expect(listed.items[0]?.current).toBe(true);
    expect(await refusal(client.revokeSession({ caller: callerA, id: b.session.id }))).toMatchObject({ status: 404 });
    await client.revokeSession({ caller: callerA, id: a.session.id });
    expect(await refusal(client.verifyCredential({ credential: a.token }))).toMatchObject({ status: 401 });
    await expect.poll(() => events.map((e) => e.data.id)).toContain(a.session.id);
    const keyCaller = makeCaller({ kind: "api_key", principalId: "k", scope: "admin" });
    expect(await refusal(client.listSessions({ caller: keyCaller }))).toMatchObject({ status: 403 });
  });
});
