/**
 * Renaming and deleting groups through HTTP (ARCHITECTURE section 7, spec doc 1 sections 4.4 and
 * 7): operators only; a group's apps, builds, queue, keys and members follow its rename; a rename
 * or delete holds the group lock, so a registration meanwhile answers group_busy; a group that
 * still owns apps is not deleted. The lock is held from the test through identity's own RPC, as a
 * rename in progress holds it; the races of a registration against a rename or delete are driven
 * in apps-builds' integration tests (services/apps-builds/test/group-lock.test.ts).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { createServiceClient } from "@platform/rpc";
import { IdentityService } from "@platform/proto";
import { call, seedMember, type Member } from "./support.ts";

let fleet: TestFleet;
let api: string;
let identity: ReturnType<typeof createServiceClient<typeof IdentityService>>;
let acmeKey: string;
let globexKey: string;
let member: Member;

const repo = (name: string) => `https://example.com/${name}.git`;

async function key(group: string, scope: string) {
  const r = await call(api, "POST", "/keys", { credential: fleet.rootKey, body: { name: `${group}-${scope}`, scope, group } });
  expect(r.status).toBe(201);
  return r.body.key as string;
}

beforeAll(async () => {
  fleet = await startTestFleet({ agent: false });
  api = fleet.api;
  identity = createServiceClient(IdentityService, fleet.env.IDENTITY_URL!, { timeoutMs: 15_000, token: fleet.env.PLATFORM_INTERNAL_TOKEN });
  for (const slug of ["acme", "globex", "busy"]) expect((await call(api, "POST", "/groups", { credential: fleet.rootKey, body: { slug } })).status).toBe(201);
  acmeKey = await key("acme", "admin");
  globexKey = await key("globex", "admin");
  member = await seedMember(fleet, { email: "wile@example.com", memberships: [["acme", "deployer"]] });
});

afterAll(() => fleet?.stop());

describe("who may rename and delete groups", () => {
  it("refuses tenants with 403, whatever the group", async () => {
    for (const credential of [acmeKey, member.token]) {
      expect((await call(api, "PATCH", "/groups/acme", { credential, body: { slug: "acme-x" } })).status).toBe(403);
      expect((await call(api, "PATCH", "/groups/globex", { credential, body: { display_name: "Mine" } })).status).toBe(403);
      expect((await call(api, "DELETE", "/groups/acme", { credential })).status).toBe(403);
      expect((await call(api, "DELETE", "/groups/globex", { credential })).status).toBe(403);
    }
  });

  it("answers an operator's unknown group with 404, a bad slug with 422 and a taken one with 409 group_exists", async () => {
    const root = fleet.rootKey;
    expect((await call(api, "PATCH", "/groups/nope", { credential: root, body: { slug: "nope-2" } })).status).toBe(404);
    expect((await call(api, "DELETE", "/groups/nope", { credential: root })).status).toBe(404);
    const bad = await call(api, "PATCH", "/groups/acme", { credential: root, body: { slug: "Not A Slug" } });
    expect(bad.status).toBe(422);
    expect(bad.body.detail).toMatch(/Group slug must be/);
    expect(await call(api, "PATCH", "/groups/acme", { credential: root, body: { slug: "globex" } })).toMatchObject({ status: 409, body: { detail: { code: "group_exists" } } });
    expect(await call(api, "PATCH", "/groups/globex", { credential: root, body: { display_name: "Globex Corporation" } })).toMatchObject({
      status: 200,
      body: { slug: "globex", display_name: "Globex Corporation" },
    });
  });
});

describe("a renamed group", () => {
  let buildId: string;

  beforeAll(async () => {
    expect((await call(api, "POST", "/apps", { credential: acmeKey, body: { app_name: "roadrunner", repository: repo("acme/roadrunner") } })).status).toBe(201);
    const build = await call(api, "POST", "/builds?skip_preflight=true", { credential: acmeKey, body: { app_name: "roadrunner", repository: repo("acme/roadrunner"), auto_deploy: false } });
    expect(build.status).toBe(202);
    buildId = build.body.build_id;
    // Seen once, so the gateway has the key and the session cached under the old slug.
    expect((await call(api, "GET", "/auth/me", { credential: acmeKey })).body.group_slug).toBe("acme");
    expect((await call(api, "GET", "/auth/me", { credential: member.token })).body.memberships).toContainEqual({ group_slug: "acme", role: "deployer" });

    const renamed = await call(api, "PATCH", "/groups/acme", { credential: fleet.rootKey, body: { slug: "acme-co", display_name: "Acme Co" } });
    expect(renamed).toMatchObject({ status: 200, body: { slug: "acme-co", display_name: "Acme Co" } });
  });

  it("is the group its key and its members act in, under the new slug", async () => {
    await expect.poll(async () => (await call(api, "GET", "/auth/me", { credential: acmeKey })).body.group_slug, { timeout: 10_000 }).toBe("acme-co");
    await expect
      .poll(async () => (await call(api, "GET", "/auth/me", { credential: member.token })).body.memberships, { timeout: 10_000 })
      .toContainEqual({ group_slug: "acme-co", role: "deployer" });
    expect((await call(api, "GET", "/groups", { credential: member.token })).body.items.map((g: { slug: string }) => g.slug)).toContain("acme-co");
  });

  it("takes its apps, builds and queue along", async () => {
    await expect
      .poll(async () => (await call(api, "GET", "/apps", { credential: acmeKey })).body.items.map((a: { app_name: string; group_slug: string }) => `${a.app_name}@${a.group_slug}`), {
        timeout: 10_000,
      })
      .toEqual(["roadrunner@acme-co"]);
    expect((await call(api, "GET", `/builds/id/${buildId}`, { credential: acmeKey })).status).toBe(200);
    await expect
      .poll(async () => (await call(api, "GET", "/deployments/queue?all=true", { credential: acmeKey })).body.map((a: { action_id: string }) => a.action_id), { timeout: 10_000 })
      .toContain(buildId);
    expect((await call(api, "GET", "/apps?group=acme-co", { credential: fleet.rootKey })).body.total).toBe(1);
  });

  it("registers new apps under the new slug", async () => {
    const r = await call(api, "POST", "/apps", { credential: acmeKey, body: { app_name: "coyote", repository: repo("acme/coyote") } });
    expect(r).toMatchObject({ status: 201, body: { app_name: "coyote", group_slug: "acme-co" } });
    // A member names the group it acts in; a build of an unknown app registers it there.
    const built = await call(api, "POST", "/builds?skip_preflight=true&group=acme-co", {
      credential: member.token,
      body: { app_name: "anvil", repository: repo("acme/anvil"), auto_deploy: false },
    });
    expect(built.status).toBe(202);
    expect((await call(api, "GET", "/apps/anvil?group=acme-co", { credential: member.token })).body.group_slug).toBe("acme-co");
  });

  it("no longer answers to its old slug, which no other group may take", async () => {
    await expect.poll(async () => (await call(api, "GET", "/apps?group=acme", { credential: fleet.rootKey })).status, { timeout: 10_000 }).toBe(404);
    expect((await call(api, "GET", "/apps?group=acme", { credential: acmeKey })).status).toBe(404);
    expect(await call(api, "POST", "/groups", { credential: fleet.rootKey, body: { slug: "acme" } })).toMatchObject({
      status: 409,
      body: { detail: { code: "group_slug_reserved" } },
    });
    // Another tenant never sees it.
    expect((await call(api, "GET", "/apps/roadrunner", { credential: globexKey })).status).toBe(404);
  });
});

describe("the group lock", () => {
  it("answers registrations 409 group_busy with retry_after while a rename holds it, and lets them in once it is gone", async () => {
    const held = await identity.acquireGroupLease({ groupSlug: "busy", mode: "exclusive", holder: "a rename in progress", ttlMs: 30_000, waitMs: 0 });
    expect(held.outcome).toBe("granted");
    const busyKey = await key("busy", "admin");
    try {
      const r = await call(api, "POST", "/apps", { credential: busyKey, body: { app_name: "waits", repository: repo("busy/waits") } });
      expect(r).toMatchObject({ status: 409, body: { detail: { code: "group_busy" } } });
      expect(r.body.detail.retry_after).toBeGreaterThan(20);
      expect(r.body.detail.message).toMatch(/retry in \d+ s/);
      const build = await call(api, "POST", "/builds?skip_preflight=true", { credential: busyKey, body: { app_name: "waits", repository: repo("busy/waits") } });
      expect(build).toMatchObject({ status: 409, body: { detail: { code: "group_busy" } } });
      expect((await call(api, "GET", "/apps", { credential: busyKey })).body.total).toBe(0);
    } finally {
      await identity.releaseGroupLease({ leaseId: held.lease!.id });
    }
    expect((await call(api, "POST", "/apps", { credential: busyKey, body: { app_name: "waits", repository: repo("busy/waits") } })).status).toBe(201);
  });

  it("answers a rename 409 group_busy while a registration holds it", async () => {
    const registration = await identity.acquireGroupLease({ groupSlug: "busy", mode: "shared", holder: "a registration in progress", ttlMs: 30_000, waitMs: 0 });
    try {
      const r = await call(api, "PATCH", "/groups/busy", { credential: fleet.rootKey, body: { slug: "busy-2" } });
      expect(r).toMatchObject({ status: 409, body: { detail: { code: "group_busy", retry_after: expect.any(Number) } } });
    } finally {
      await identity.releaseGroupLease({ leaseId: registration.lease!.id });
    }
    expect((await call(api, "GET", "/groups", { credential: fleet.rootKey })).body.items.map((g: { slug: string }) => g.slug)).toContain("busy");
  });
});

describe("deleting a group", () => {
  it("refuses a user's personal group", async () => {
    expect(await call(api, "DELETE", `/groups/${member.personalGroup}`, { credential: fleet.rootKey })).toMatchObject({
      status: 409,
      body: { detail: { code: "personal_group" } },
    });
  });

  it("refuses while the group owns apps, then deletes it with its keys once they are gone", async () => {
    const refused = await call(api, "DELETE", "/groups/acme-co", { credential: fleet.rootKey });
    expect(refused).toMatchObject({ status: 409, body: { detail: { code: "group_has_apps", app_count: 3 } } });
    for (const app of ["roadrunner", "coyote", "anvil"]) {
      // No agent runs here: a build still queued keeps its branch (409 build_in_flight) until it is cancelled.
      for (const _ of (await call(api, "GET", `/builds?app_name=${app}`, { credential: acmeKey })).body.items) {
        const deleting = await call(api, "DELETE", `/apps/${app}`, { credential: acmeKey });
        expect(deleting).toMatchObject({ status: 409, body: { detail: { code: "build_in_flight" } } });
        const buildId = deleting.body.detail.build_id as string;
        expect((await call(api, "POST", `/deployments/${buildId}/cancel`, { credential: acmeKey })).body.status).toBe("cancelled");
        await expect.poll(async () => (await call(api, "GET", `/builds/id/${buildId}`, { credential: acmeKey })).body.status, { timeout: 10_000 }).toBe("cancelled");
      }
      expect((await call(api, "DELETE", `/apps/${app}`, { credential: acmeKey })).status).toBe(204);
    }

    expect((await call(api, "DELETE", "/groups/acme-co", { credential: fleet.rootKey })).status).toBe(204);
    const groups = (await call(api, "GET", "/groups", { credential: fleet.rootKey })).body.items.map((g: { slug: string }) => g.slug);
    expect(groups).not.toContain("acme-co");
    await expect.poll(async () => (await call(api, "GET", "/apps", { credential: acmeKey })).status, { timeout: 10_000 }).toBe(401);
    await expect
      .poll(async () => (await call(api, "GET", "/auth/me", { credential: member.token })).body.memberships.map((m: { group_slug: string }) => m.group_slug), { timeout: 10_000 })
      .toEqual([member.personalGroup]);
    // Its slugs are free again.
    expect((await call(api, "POST", "/groups", { credential: fleet.rootKey, body: { slug: "acme" } })).status).toBe(201);
    expect((await call(api, "GET", "/apps?group=acme", { credential: fleet.rootKey })).body.total).toBe(0);
  });
});

describe("the OpenAPI document", () => {
  it("describes the two routes and the group lock codes of registration", async () => {
    const doc = (await call(api, "GET", "/openapi.json", { credential: fleet.rootKey })).body;
    const group = doc.paths["/api/groups/{slug}"];
    expect(Object.keys(group.patch.responses)).toEqual(expect.arrayContaining(["200", "401", "403", "404", "409", "422"]));
    expect(group.patch.requestBody.content["application/json"].schema.properties).toHaveProperty("display_name");
    expect(group.patch.responses["409"].description).toMatch(/group_busy/);
    expect(Object.keys(group.delete.responses)).toEqual(expect.arrayContaining(["204", "404", "409"]));
    expect(group.delete.responses["409"].description).toMatch(/group_has_apps/);
    for (const path of ["/api/apps", "/api/builds"]) {
      const conflicts = doc.paths[path].post.responses["409"].description as string;
      for (const code of ["group_busy", "group_renamed_during_registration", "group_deleted_during_registration"]) expect(conflicts, path).toContain(code);
      expect(doc.paths[path].post.responses["404"].description, path).toMatch(/deleted while the registration waited/);
    }
  });
});
