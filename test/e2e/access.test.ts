/**
 * Spec document 1 section 5 and the routes of ARCHITECTURE section 7, through HTTP only, against
 * the fleet as real processes (two gateway replicas sharing identity).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestFleet, type TestFleet } from "@platform/testing";
import { call, seedMember, type Member } from "./support.ts";

const INVALID = { detail: "Invalid or revoked API key" };

let fleet: TestFleet;
let api: string;
let root: string;
const keys: Record<string, { id: string; key: string }> = {};
let owner: Member;
let viewer: Member;
let platformAdmin: Member;

async function mintKey(name: string, scope: string, group: string) {
  const r = await call(api, "POST", "/keys", { credential: root, body: { name, scope, group } });
  expect(r.status).toBe(201);
  return { id: r.body.id as string, key: r.body.key as string };
}

beforeAll(async () => {
  fleet = await startTestFleet({ gatewayReplicas: 2 });
  api = fleet.api;
  root = fleet.rootKey;
  for (const slug of ["acme", "globex"]) {
    expect((await call(api, "POST", "/groups", { credential: root, body: { slug } })).status).toBe(201);
  }
  keys.acmeRead = await mintKey("acme-read", "read", "acme");
  keys.acmeDeploy = await mintKey("acme-deploy", "deploy", "acme");
  keys.acmeAdmin = await mintKey("acme-admin", "admin", "acme");
  keys.globexAdmin = await mintKey("globex-admin", "admin", "globex");
  const platform = await call(api, "POST", "/keys", { credential: root, body: { name: "legacy", scope: "admin", platform: true } });
  expect(platform.status).toBe(201);
  keys.platform = { id: platform.body.id, key: platform.body.key };
  owner = await seedMember(fleet, { email: "owner@acme.test", memberships: [["acme", "owner"]] });
  viewer = await seedMember(fleet, { email: "viewer@acme.test", memberships: [["acme", "viewer"], ["globex", "deployer"]] });
  platformAdmin = await seedMember(fleet, { email: "ops@platform.test", platformAdmin: true });
});

afterAll(async () => {
  await fleet?.stop();
});

describe("health", () => {
  it("answers without a credential with status, environment and version", async () => {
    const r = await call(api, "GET", "/health");
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ status: "ok", environment: "dev", version: expect.any(String) });
  });

  it("adds the database status and table count with deep=true, and ignores a legacy environment", async () => {
    const r = await call(api, "GET", "/health?deep=true&environment=production&environment=staging");
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: "ok", environment: "dev", database: "ok" });
    expect(r.body.tables).toBeGreaterThanOrEqual(6);
  });
});

describe("credentials (doc 1 section 5)", () => {
  it("accepts `Bearer <credential>` and the bare credential", async () => {
    expect((await call(api, "GET", "/auth/me", { credential: keys.acmeRead!.key })).status).toBe(200);
    expect((await call(api, "GET", "/auth/me", { headers: { authorization: keys.acmeRead!.key } })).status).toBe(200);
    expect((await call(api, "GET", "/auth/me", { headers: { authorization: owner.token } })).status).toBe(200);
  });

  it("answers 401 with the one text for every credential that is not live", async () => {
    const cases: Array<Record<string, string>> = [
      {},
      { authorization: "" },
      { authorization: "Bearer" },
      { authorization: "Bearer sk_live_abc" },
      { authorization: "Basic cGZfazFfYWJj" },
      { authorization: "Bearer pf_k1_doesnotexist" },
      { authorization: "ses_doesnotexist" },
    ];
    for (const headers of cases) {
      const r = await call(api, "GET", "/groups", { headers });
      expect(r.status, JSON.stringify(headers)).toBe(401);
      expect(r.body).toEqual(INVALID);
    }
  });

  it("applies the scope hierarchy with the exact 403 text", async () => {
    const read = await call(api, "GET", "/keys", { credential: keys.acmeRead!.key });
    expect(read.status).toBe(403);
    expect(read.body).toEqual({ detail: "Scope 'admin' required, you have 'read'" });
    const deploy = await call(api, "GET", "/keys", { credential: keys.acmeDeploy!.key });
    expect(deploy.body).toEqual({ detail: "Scope 'admin' required, you have 'deploy'" });
    expect((await call(api, "GET", "/keys", { credential: keys.acmeAdmin!.key })).status).toBe(200);
    expect((await call(api, "GET", "/groups", { credential: keys.acmeRead!.key })).status).toBe(200);
  });

  it("gives a session the scope of its role in the selected group", async () => {
    const inAcme = await call(api, "GET", "/auth/me?group=acme", { credential: viewer.token });
    expect(inAcme.body).toMatchObject({ kind: "session", scope: "read", group_slug: "acme" });
    const inGlobex = await call(api, "GET", "/auth/me", { credential: viewer.token, headers: { "x-platform-group": "globex" } });
    expect(inGlobex.body).toMatchObject({ scope: "deploy", group_slug: "globex" });
    const denied = await call(api, "GET", "/keys?group=acme", { credential: viewer.token });
    expect(denied.status).toBe(403);
    expect(denied.body).toEqual({ detail: "Scope 'admin' required, you have 'read'" });
  });

  it("records last_used_at on use, also for uses answered from the gateway's cache", async () => {
    const k = await mintKey("touch", "read", "acme");
    await call(fleet.apis[1]!, "GET", "/groups", { credential: k.key });
    await call(fleet.apis[1]!, "GET", "/groups", { credential: k.key });
    await expect
      .poll(async () => {
        const list = await call(api, "GET", "/keys?group=acme", { credential: root });
        return list.body.items.find((i: { id: string }) => i.id === k.id)?.last_used_at;
      })
      .toEqual(expect.any(String));
  });

  it("a revoked key answers 401 on every gateway replica, including one that had it cached", async () => {
    const k = await mintKey("doomed", "read", "acme");
    for (const base of fleet.apis) expect((await call(base, "GET", "/groups", { credential: k.key })).status).toBe(200);
    const del = await call(fleet.apis[0]!, "DELETE", `/keys/${k.id}`, { credential: keys.acmeAdmin!.key });
    expect(del.status).toBe(204);
    expect(await call(fleet.apis[0]!, "GET", "/groups", { credential: k.key })).toMatchObject({ status: 401, body: INVALID });
    await expect.poll(async () => (await call(fleet.apis[1]!, "GET", "/groups", { credential: k.key })).status, { timeout: 5000 }).toBe(401);
  });

  it("refuses a disabled account with 403", async () => {
    const disabled = await seedMember(fleet, { email: "gone@acme.test", memberships: [["acme", "owner"]], disabled: true });
    expect((await call(api, "GET", "/auth/me", { credential: disabled.token })).status).toBe(403);
  });
});

describe("group selection", () => {
  it("defaults to the key's group, then the personal group", async () => {
    expect((await call(api, "GET", "/auth/me", { credential: keys.acmeRead!.key })).body.group_slug).toBe("acme");
    expect((await call(api, "GET", "/auth/me", { credential: owner.token })).body).toMatchObject({
      group_slug: owner.personalGroup,
      scope: "admin",
    });
    expect((await call(api, "GET", "/auth/me", { credential: root })).body.group_slug).toBeNull();
  });

  it("takes ?group= before the header, and a non-member selector gives 404", async () => {
    const k = keys.acmeRead!.key;
    expect((await call(api, "GET", "/auth/me?group=acme", { credential: k, headers: { "x-platform-group": "globex" } })).body.group_slug).toBe("acme");
    const viaQuery = await call(api, "GET", "/auth/me?group=globex", { credential: k, headers: { "x-platform-group": "acme" } });
    expect(viaQuery).toMatchObject({ status: 404, body: { detail: "Group 'globex' not found" } });
    expect((await call(api, "GET", "/auth/me", { credential: k, headers: { "x-platform-group": "globex" } })).status).toBe(404);
    expect((await call(api, "GET", "/auth/me?group=nowhere", { credential: owner.token })).status).toBe(404);
  });

  it("needs the deploy scope in the group a registration names, not only in the group it acts in", async () => {
    // viewer: deployer in globex, viewer in acme.
    const r = await call(api, "POST", "/apps?group=globex", {
      credential: viewer.token,
      body: { app_name: "sneaky", repository: "https://github.com/acme/sneaky.git", group_slug: "acme" },
    });
    expect(r).toMatchObject({ status: 403, body: { detail: "Scope 'deploy' required, you have 'read'" } });
    const listed = await call(api, "GET", "/apps?group=acme", { credential: owner.token });
    expect(listed.body.items.map((a: { app_name: string }) => a.app_name)).not.toContain("sneaky");
  });

  it("lets operators select any existing group and nothing else", async () => {
    expect((await call(api, "GET", "/auth/me?group=globex", { credential: root })).body.group_slug).toBe("globex");
    expect((await call(api, "GET", "/auth/me?group=nowhere", { credential: root })).status).toBe(404);
  });
});

describe("platform-operator gate", () => {
  it("refuses anonymous with 401 and every tenant, a group owner included, with 403", async () => {
    expect((await call(api, "POST", "/groups", { body: { slug: "x1" } })).status).toBe(401);
    for (const credential of [keys.acmeAdmin!.key, owner.token]) {
      const r = await call(api, "POST", "/groups", { credential, body: { slug: "x1" } });
      expect(r.status).toBe(403);
      expect(r.body).toEqual({ detail: "Platform operator required" });
    }
  });

  it("holds an operator to its scope: a read-only platform key may not create, rename or delete groups", async () => {
    const readOnly = await call(api, "POST", "/keys", { credential: root, body: { name: "monitoring", scope: "read", platform: true } });
    expect(readOnly.status).toBe(201);
    // The secret is in this answer alone: nothing along the way may keep it.
    expect(readOnly.headers.get("cache-control")).toBe("no-store");
    const k = readOnly.body.key as string;
    expect(await call(api, "POST", "/groups", { credential: k, body: { slug: "x2" } })).toMatchObject({ status: 403, body: { detail: "Scope 'admin' required, you have 'read'" } });
    expect((await call(api, "PATCH", "/groups/globex", { credential: k, body: { display_name: "Mine" } })).status).toBe(403);
    expect((await call(api, "DELETE", "/groups/globex", { credential: k })).status).toBe(403);
    expect((await call(api, "GET", "/groups", { credential: k })).status).toBe(200);
  });

  it("admits the root key, a legacy platform key and a platform-admin session", async () => {
    for (const [i, credential] of [root, keys.platform!.key, platformAdmin.token].entries()) {
      const r = await call(api, "POST", "/groups", { credential, body: { slug: `ops-${i}`, display_name: `Ops ${i}` } });
      expect(r.status).toBe(201);
      expect(r.body).toEqual({ slug: `ops-${i}`, display_name: `Ops ${i}`, created_at: expect.any(String) });
    }
  });

  it("shows operators every group and tenants their own", async () => {
    const all = await call(api, "GET", "/groups", { credential: root });
    expect(all.body.items.map((g: { slug: string }) => g.slug)).toEqual(expect.arrayContaining(["acme", "globex", "ops-0"]));
    const mine = await call(api, "GET", "/groups", { credential: keys.acmeRead!.key });
    expect(mine.body).toEqual({ items: [expect.objectContaining({ slug: "acme" })], total: 1 });
  });
});

describe("bad input", () => {
  it("refuses a NUL character in the path or the query with 400, in a JSON string with 422, before any service sees it", async () => {
    for (const path of ["/logs?search=a%00b", "/apps/a%00b", "/builds?app_name=x%00"]) {
      const r = await call(api, "GET", path, { credential: root });
      expect(r.status, path).toBe(400);
      expect(r.body.detail).toMatch(/NUL/);
    }
    const body = await call(api, "POST", "/groups", { credential: root, body: { slug: "nul\u0000" } });
    expect(body).toMatchObject({ status: 422, body: { detail: { code: "nul_character" } } });
    // The escape itself, as text, is no NUL.
    expect((await call(api, "POST", "/groups", { credential: root, body: { slug: "a\\u0000" } })).status).toBe(422);
  });

  it("refuses half of a surrogate pair in a JSON string with 422, where a whole pair is text", async () => {
    const lone = await call(api, "POST", "/groups", { credential: root, body: { slug: "lone", display_name: "a\ud800b" } });
    expect(lone).toMatchObject({ status: 422, body: { detail: { code: "lone_surrogate" } } });
    const groups = await call(api, "GET", "/groups", { credential: root });
    expect(groups.body.items.map((g: { slug: string }) => g.slug)).not.toContain("lone");
    const pair = await call(api, "POST", "/groups", { credential: root, body: { slug: "pair", display_name: "a\u{1F600}b" } });
    expect(pair).toMatchObject({ status: 201, body: { display_name: "a\u{1F600}b" } });
  });

  it("reads a number in the query only when written plainly", async () => {
    for (const limit of ["0x10", "1e1", "%205", "5.0"]) {
      const r = await call(api, "GET", `/builds?limit=${limit}`, { credential: root });
      expect(r, limit).toMatchObject({ status: 422, body: { detail: { code: "invalid_request", message: "querystring.limit must be integer." } } });
    }
    expect((await call(api, "GET", "/builds?limit=05", { credential: root })).status).toBe(200);
  });

  it("refuses a body nested deeper than 32 levels with 422 too_deep, not a server error", async () => {
    const nested = (levels: number) => {
      let v: unknown = 1;
      for (let i = 0; i < levels; i++) v = { k: v, s: "]]]" };
      return v as Record<string, unknown>;
    };
    const deep = await call(api, "PUT", "/apps/nothing/config", { credential: root, body: { config: nested(60) } });
    expect(deep).toMatchObject({ status: 422, body: { detail: { code: "too_deep", errors: [{ code: "too_deep" }] } } });
    // Within the bound, the route answers as it would (the app does not exist).
    expect((await call(api, "PUT", "/apps/nothing/config", { credential: root, body: { config: nested(10) } })).status).toBe(404);
  });

  it("refuses an offset past what a page can start at with 422, not a server error", async () => {
    for (const path of ["/logs?offset=2147483648", "/builds?offset=99999999999999", "/deployments?offset=2147483648"]) {
      expect((await call(api, "GET", path, { credential: root })).status, path).toBe(422);
    }
    expect((await call(api, "GET", "/logs?offset=2147483647", { credential: root })).status).toBe(200);
  });

  it("refuses the keys __proto__ and constructor.prototype with 422 saying so, malformed JSON with 400", async () => {
    const put = (body: string) =>
      fetch(`${api}/vars/nothing`, { method: "PUT", headers: { authorization: `Bearer ${root}`, "content-type": "application/json" }, body });
    for (const body of ['{"variables":{"__proto__":"a"}}', '{"variables":{"constructor":{"prototype":"a"}}}']) {
      const r = await put(body);
      expect(r.status, body).toBe(422);
      expect(((await r.json()) as { detail: { code: string } }).detail.code).toBe("forbidden_key");
    }
    expect((await put('{"variables":')).status).toBe(400);
  });

  it("answers a body that is not JSON with 415 on every route", async () => {
    for (const [method, path] of [["POST", "/apps"], ["PATCH", "/apps/nothing"], ["PUT", "/apps/nothing/config"], ["PUT", "/vars/nothing"]] as const) {
      const r = await fetch(`${api}${path}`, { method, headers: { authorization: `Bearer ${root}`, "content-type": "text/plain" }, body: "display_name=x" });
      expect(r.status, `${method} ${path}`).toBe(415);
      expect(await r.json()).toEqual({ detail: "Unsupported content type; send application/json." });
    }
  });

  it("answers a URL too large for the HTTP parser with 431 {detail}", async () => {
    const r = await fetch(`${api}/apps/${"x".repeat(20_000)}`, { headers: { authorization: `Bearer ${root}` } });
    expect(r.status).toBe(431);
    expect(await r.json()).toEqual({ detail: expect.stringContaining("too large") });
  });

  it("refuses a number too large to represent with 422 (400 where the route says validation is 400), not a server error", async () => {
    for (const [method, path, body, status] of [
      ["POST", "/apps", '{"app_name":"huge","repository":"https://example.com/a.git","deploy_config":{"x":1e400}}', 422],
      ["PUT", "/apps/nothing/config", '{"config":{"type":"container","x":-2E+999}}', 422],
      ["POST", "/deployments", '{"app_name":"huge","x":1e400}', 400],
    ] as const) {
      const r = await fetch(`${api}${path}`, { method, headers: { authorization: `Bearer ${root}`, "content-type": "application/json" }, body });
      expect(r.status, path).toBe(status);
      expect(((await r.json()) as { detail: { code: string } }).detail.code).toBe("number_out_of_range");
    }
  });

  it("refuses a field a route does not know with 422 naming it, instead of dropping it", async () => {
    // POST /api/deployments answers its validation failures 400 (doc 1 section 4.5); the others 422.
    const deploy = await call(api, "POST", "/deployments", { credential: root, body: { app_name: "nothing", replicas: 3 } });
    expect(deploy).toMatchObject({ status: 400, body: { detail: { code: "invalid_request" } } });
    expect(deploy.body.detail.message).toMatch(/replicas is not allowed/);
    const scale = await call(api, "PATCH", "/apps/nothing/services/web/replicas", { credential: root, body: { replicas: 2, brnach: "dev" } });
    expect(scale.status).toBe(422);
    expect(scale.body.detail.message).toMatch(/brnach is not allowed/);
    // Every route's body is closed, not only those that say so.
    const build = await call(api, "POST", "/builds", { credential: root, body: { app_name: "nothing", repository: "https://example.com/a.git", brnach: "dev" } });
    expect(build.status).toBe(422);
    expect(build.body.detail.message).toMatch(/brnach is not allowed/);
    // A field made of named fields is closed as well.
    const register = await call(api, "POST", "/apps", { credential: root, body: { app_name: "nothing", repository: "https://example.com/a.git", clone_components: { db: true, dbs: true } } });
    expect(register.status).toBe(422);
    expect(register.body.detail.message).toMatch(/clone_components\.dbs is not allowed/);
  });

  it("takes a JSON body's values as sent: a string is not read as the boolean or number it spells", async () => {
    const body = { app_name: "nothing", repository: "https://example.com/a.git" };
    const flag = await call(api, "POST", "/builds", { credential: root, body: { ...body, auto_deploy: "false" } });
    expect(flag).toMatchObject({ status: 422, body: { detail: { code: "invalid_request" } } });
    expect(flag.body.detail.message).toMatch(/auto_deploy must be boolean/);
    const name = await call(api, "POST", "/builds", { credential: root, body: { ...body, app_name: 7 } });
    expect(name.status).toBe(422);
    expect(name.body.detail.message).toMatch(/app_name must be string/);
    // The query string is text, read as its parameter's type.
    expect((await call(api, "GET", "/builds?limit=5", { credential: root })).status).toBe(200);
    // The legacy environment parameter is ignored however often it is given.
    expect((await call(api, "GET", "/builds?environment=prod&environment=dev", { credential: root })).status).toBe(200);
  });
});

describe("groups and keys", () => {
  it("refuses a duplicate group with 409 and a bad slug with 422", async () => {
    const dup = await call(api, "POST", "/groups", { credential: root, body: { slug: "acme" } });
    expect(dup.status).toBe(409);
    expect(dup.body.detail).toMatchObject({ code: "group_exists", message: expect.any(String) });
    expect((await call(api, "POST", "/groups", { credential: root, body: { slug: "Bad_Slug" } })).status).toBe(422);
    expect((await call(api, "POST", "/groups", { credential: root, body: {} })).status).toBe(422);
  });

  it("binds a key to the group named by `group` or by its alias `group_slug`", async () => {
    const alias = await call(api, "POST", "/keys", { credential: root, body: { name: "by-alias", scope: "read", group_slug: "globex" } });
    expect(alias).toMatchObject({ status: 201, body: { group_slug: "globex" } });
    const both = await call(api, "POST", "/keys", { credential: root, body: { name: "both", scope: "read", group: "acme", group_slug: "globex" } });
    expect(both).toMatchObject({ status: 201, body: { group_slug: "acme" } });
  });

  it("shows a new key once and lists it without the key or its hash", async () => {
    const created = await call(api, "POST", "/keys", { credential: keys.acmeAdmin!.key, body: { name: "deployer", scope: "deploy" } });
    expect(created.status).toBe(201);
    expect(created.body).toEqual({
      id: expect.any(String),
      key: expect.stringMatching(/^pf_k1_/),
      prefix: expect.any(String),
      name: "deployer",
      scope: "deploy",
      group_slug: "acme",
      created_at: expect.any(String),
    });
    const list = await call(api, "GET", "/keys", { credential: keys.acmeAdmin!.key });
    const text = JSON.stringify(list.body);
    expect(text).not.toContain(created.body.key);
    const item = list.body.items.find((k: { id: string }) => k.id === created.body.id);
    expect(Object.keys(item).sort()).toEqual(["created_at", "group_slug", "id", "kind", "last_used_at", "name", "prefix", "revoked_at", "scope"]);
    expect(list.body.items.every((k: { group_slug: string }) => k.group_slug === "acme")).toBe(true);
    expect(list.body.total).toBe(list.body.items.length);
  });

  it("lets a tenant mint only for its group and up to its own scope", async () => {
    const deployer = await call(api, "POST", "/keys", { credential: viewer.token, headers: { "x-platform-group": "globex" }, body: { name: "n", scope: "read" } });
    expect(deployer.status).toBe(403);
    const higher = await call(api, "POST", "/keys?group=acme", { credential: owner.token, body: { name: "n", scope: "admin" } });
    expect(higher.status).toBe(201);
    expect(higher.body.group_slug).toBe("acme");
    const other = await call(api, "POST", "/keys", { credential: keys.acmeAdmin!.key, body: { name: "n", scope: "read", group: "globex" } });
    expect(other.status).toBe(404);
    const platform = await call(api, "POST", "/keys", { credential: keys.acmeAdmin!.key, body: { name: "n", scope: "read", platform: true } });
    expect(platform.status).toBe(403);
    const bad = await call(api, "POST", "/keys", { credential: keys.acmeAdmin!.key, body: { name: "n", scope: "superuser" } });
    expect(bad.status).toBe(422);
  });

  it("answers 404, never 403, for another tenant's key and group", async () => {
    const foreign = await call(api, "DELETE", `/keys/${keys.globexAdmin!.id}`, { credential: keys.acmeAdmin!.key });
    expect(foreign.status).toBe(404);
    const unknown = await call(api, "DELETE", "/keys/00000000-0000-0000-0000-000000000000", { credential: keys.acmeAdmin!.key });
    expect(unknown).toMatchObject({ status: 404, body: foreign.body });
    expect((await call(api, "GET", "/keys?group=globex", { credential: keys.acmeAdmin!.key })).status).toBe(404);
    expect((await call(api, "GET", "/groups?group=globex", { credential: keys.acmeRead!.key })).status).toBe(404);
    // The key still works: the refused revocation changed nothing.
    expect((await call(api, "GET", "/auth/me", { credential: keys.globexAdmin!.key })).status).toBe(200);
  });

  it("keeps the root key: revoking it is refused with 409", async () => {
    const me = await call(api, "GET", "/auth/me", { credential: root });
    const r = await call(api, "DELETE", `/keys/${me.body.key.id}`, { credential: root });
    expect(r.status).toBe(409);
    expect(r.body.detail.code).toBe("root_key_protected");
  });
});

describe("auth/me and sessions", () => {
  it("describes the caller", async () => {
    const key = await call(api, "GET", "/auth/me", { credential: keys.acmeDeploy!.key });
    expect(key.body).toMatchObject({ kind: "api_key", scope: "deploy", group_slug: "acme", user: null, memberships: [], platform_operator: false });
    const session = await call(api, "GET", "/auth/me", { credential: viewer.token });
    expect(session.body).toMatchObject({
      kind: "session",
      user: { email: "viewer@acme.test", platform_admin: false },
      memberships: expect.arrayContaining([{ group_slug: "acme", role: "viewer" }, { group_slug: "globex", role: "deployer" }]),
      platform_operator: false,
    });
    expect((await call(api, "GET", "/auth/me", { credential: platformAdmin.token })).body.platform_operator).toBe(true);
    expect((await call(api, "GET", "/auth/me", { credential: keys.platform!.key })).body).toMatchObject({ platform_operator: true, platform_root: false });
  });

  it("lists and revokes a session's own sessions; API keys are refused", async () => {
    expect((await call(api, "GET", "/auth/sessions", { credential: keys.acmeAdmin!.key })).status).toBe(403);
    const second = await seedMember(fleet, { email: "two@acme.test", memberships: [["acme", "deployer"]], kind: "cli" });
    const list = await call(api, "GET", "/auth/sessions", { credential: second.token });
    expect(list.status).toBe(200);
    expect(list.body.total).toBe(1);
    expect(list.body.items[0]).toMatchObject({ kind: "cli", current: true });
    const other = await call(api, "DELETE", `/auth/sessions/${list.body.items[0].id}`, { credential: owner.token });
    expect(other.status).toBe(404);
    expect((await call(api, "DELETE", `/auth/sessions/${list.body.items[0].id}`, { credential: second.token })).status).toBe(204);
    expect(await call(api, "GET", "/auth/me", { credential: second.token })).toMatchObject({ status: 401, body: INVALID });
  });
});

describe("malformed input", () => {
  it("answers 400 for malformed JSON, 413 for an oversized body, 422 for a wrong shape, all as {detail}", async () => {
    const malformed = await call(api, "POST", "/groups", { credential: root, raw: "{not json" });
    expect(malformed.status).toBe(400);
    expect(typeof malformed.body.detail).toBe("string");
    const huge = await call(api, "POST", "/groups", { credential: root, raw: JSON.stringify({ slug: "x".repeat(2 * 1024 * 1024) }) });
    expect(huge.status).toBe(413);
    expect(huge.body.detail).toEqual(expect.any(String));
    // The config save lists "too large" among its 422 refusals, however large.
    const hugeConfig = await call(api, "PUT", "/apps/nothing/config", { credential: root, raw: JSON.stringify({ config_yaml: "x".repeat(2 * 1024 * 1024) }) });
    expect(hugeConfig).toMatchObject({ status: 422, body: { detail: { code: "too_large" } } });
    const wrong = await call(api, "POST", "/keys", { credential: root, body: { name: "x" } });
    expect(wrong.status).toBe(422);
    expect(wrong.body.detail).toMatchObject({ code: "invalid_request", message: expect.stringContaining("scope") });
  });

  it("takes a JSON content type with no body as no body: 200 where the body is optional, 422 where it is required", async () => {
    const cancel = await call(api, "POST", "/deployments/0000000000000000/cancel?group=acme", { credential: root, raw: "" });
    expect(cancel).toMatchObject({ status: 200, body: { status: "not_found" } });
    const group = await call(api, "POST", "/groups", { credential: root, raw: "" });
    expect(group).toMatchObject({ status: 422, body: { detail: { code: "invalid_request" } } });
  });

  it("answers a URL that cannot be decoded with 400 {detail}", async () => {
    for (const path of ["/builds/id/7a22664%", "/apps/%E0%A4%A"]) {
      const r = await call(api, "GET", path, { credential: root });
      expect(r.status, path).toBe(400);
      expect(r.body).toEqual({ detail: expect.stringMatching(/^Malformed request/) });
    }
  });

  it("answers unknown routes with 404 {detail}", async () => {
    const r = await call(api, "GET", "/nothing-here", { credential: root });
    expect(r).toMatchObject({ status: 404, body: { detail: "Not Found" } });
  });

  it("creates nothing when input is refused", async () => {
    const before = (await call(api, "GET", "/keys", { credential: root })).body.total;
    await call(api, "POST", "/keys", { credential: root, body: { name: "", scope: "read", group: "acme" } });
    await call(api, "POST", "/keys", { credential: root, body: { name: "n", scope: "read", group: "nowhere" } });
    expect((await call(api, "GET", "/keys", { credential: root })).body.total).toBe(before);
  });
});

describe("the services behind the gateway", () => {
  it("refuse a call that names its own caller without the fleet's internal token: only the fleet reaches them", async () => {
    // What tenant code on a host could try: a platform operator, said by itself, over plain HTTP.
    const forged = { caller: { kind: "root", principalId: "x", scope: "admin", platformOperator: true, platformRoot: true } };
    const listApps = (headers: Record<string, string>) =>
      fetch(`${fleet.env.APPS_BUILDS_URL}/platform.apps_builds.v1.AppsBuildsService/ListApps`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify(forged),
      });
    const refused = await listApps({});
    expect(refused.status).toBe(401);
    expect(await refused.json()).toMatchObject({ code: "unauthenticated" });
    expect((await listApps({ authorization: "Bearer guessed" })).status).toBe(401);
    // The fleet's own calls carry it.
    expect((await listApps({ authorization: `Bearer ${fleet.env.PLATFORM_INTERNAL_TOKEN}` })).status).toBe(200);
  });
});
