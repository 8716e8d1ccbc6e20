import { describe, expect, it } from "vitest";
import Fastify from "fastify";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { PrincipalSchema, type Principal } from "@platform/proto";
import { readCredential } from "../src/domain/credentials.ts";
import { typedBodyValidator } from "../src/domain/input-bounds.ts";
import { registerErrorHandling } from "../src/errors.ts";
import { CredentialCache } from "../src/domain/credential-cache.ts";
import { isPlatformOperator, isPlatformRoot, scopeIn, selectGroup, visibleGroups } from "../src/domain/group-selection.ts";

type Init = Exclude<MessageInitShape<typeof PrincipalSchema>, Principal>;

const key = (init: Init = {}): Principal =>
  create(PrincipalSchema, { kind: "api_key", id: "k1", scope: "deploy", keyGroup: "acme", keyKind: "group", ...init });
const session = (init: Init = {}): Principal =>
  create(PrincipalSchema, {
    kind: "session",
    id: "s1",
    user: { id: "u1", email: "a@example.com", personalGroup: "a-123456", platformAdmin: false },
    memberships: [
      { groupSlug: "a-123456", role: "owner" },
      { groupSlug: "acme", role: "viewer" },
      { groupSlug: "globex", role: "deployer" },
    ],
    ...init,
  });

describe("readCredential", () => {
  it("takes Bearer or the bare credential, dispatched on the prefix", () => {
    expect(readCredential("Bearer pf_k1_abc")).toBe("pf_k1_abc");
    expect(readCredential("bearer   ses_abc")).toBe("ses_abc");
    expect(readCredential("pf_k1_abc")).toBe("pf_k1_abc");
    expect(readCredential("ses_abc")).toBe("ses_abc");
  });

  it("rejects a missing header, a wrong prefix, a bare prefix and other schemes", () => {
    for (const h of [undefined, "", "Bearer", "Bearer xyz", "Basic pf_k1_abc", "pf_k1_", "ses_", "token pf_k1_abc", "Bearer pf_k1_a b"]) {
      expect(readCredential(h)).toBeNull();
    }
  });
});

describe("CredentialCache", () => {
  it("forgets an entry after its TTL and never keeps one past the credential's validity", () => {
    const cache = new CredentialCache(1000);
    cache.set("d1", key(), 0);
    expect(cache.get("d1", 999)).not.toBeNull();
    expect(cache.get("d1", 1000)).toBeNull();
    cache.set("d2", session({ validUntilMs: 500n }), 0);
    expect(cache.get("d2", 499)).not.toBeNull();
    expect(cache.get("d2", 500)).toBeNull();
  });

  it("drops every digest of a revoked principal", () => {
    const cache = new CredentialCache(60_000);
    cache.set("d1", key({ id: "same" }));
    cache.set("d2", key({ id: "same" }));
    cache.set("d3", key({ id: "other" }));
    cache.invalidate("same");
    expect(cache.get("d1")).toBeNull();
    expect(cache.get("d2")).toBeNull();
    expect(cache.get("d3")).not.toBeNull();
  });

  it("drops every principal naming a renamed or deleted group: key's group, membership or personal group", () => {
    const cache = new CredentialCache(60_000);
    cache.set("key-acme", key({ id: "k-acme" }));
    cache.set("key-globex", key({ id: "k-globex", keyGroup: "globex" }));
    cache.set("root", key({ id: "root", keyGroup: "", keyKind: "root" }));
    cache.set("member", session({ id: "s-member" }));
    cache.set("owner", session({ id: "s-owner", memberships: [{ groupSlug: "solo", role: "owner" }], user: { id: "u2", personalGroup: "solo" } }));
    cache.invalidateGroup("acme");
    expect(cache.get("key-acme")).toBeNull();
    expect(cache.get("member")).toBeNull();
    expect(cache.get("key-globex")).not.toBeNull();
    expect(cache.get("root")).not.toBeNull();
    expect(cache.get("owner")).not.toBeNull();
    cache.invalidateGroup("solo");
    expect(cache.get("owner")).toBeNull();
    expect(cache.size).toBe(2);
  });

  it("caches nothing with a zero TTL and stays bounded", () => {
    expect(new CredentialCache(0).size).toBe(0);
    const none = new CredentialCache(0);
    none.set("d", key());
    expect(none.get("d")).toBeNull();
    const small = new CredentialCache(60_000, 2);
    small.set("a", key({ id: "a" }));
    small.set("b", key({ id: "b" }));
    small.set("c", key({ id: "c" }));
    expect(small.size).toBe(2);
    expect(small.get("a")).toBeNull();
  });
});

describe("group selection", () => {
  it("follows the spec's order: query, header, key's group, personal group", () => {
    expect(selectGroup(key(), "q", "h")).toEqual({ slug: "q", source: "query" });
    expect(selectGroup(key(), undefined, "h")).toEqual({ slug: "h", source: "header" });
    expect(selectGroup(key(), "", " ")).toEqual({ slug: "acme", source: "key" });
    expect(selectGroup(session(), undefined, undefined)).toEqual({ slug: "a-123456", source: "personal" });
    expect(selectGroup(key({ keyGroup: "", keyKind: "root" }), undefined, undefined)).toEqual({ slug: "", source: "none" });
  });

  it("derives a session's scope from its role in the selected group", () => {
    const s = session();
    expect(scopeIn(s, "a-123456")).toBe("admin");
    expect(scopeIn(s, "acme")).toBe("read");
    expect(scopeIn(s, "globex")).toBe("deploy");
    expect(scopeIn(s, "initech")).toBe("");
    expect(scopeIn(session({ user: { id: "u", platformAdmin: true } }), "initech")).toBe("admin");
    expect(scopeIn(key(), "acme")).toBe("deploy");
  });

  it("knows operators: root key, legacy platform key, platform-admin session; not a group owner", () => {
    expect(isPlatformOperator(key({ keyKind: "root", keyGroup: "" }))).toBe(true);
    expect(isPlatformOperator(key({ keyKind: "platform", keyGroup: "" }))).toBe(true);
    expect(isPlatformOperator(key())).toBe(false);
    expect(isPlatformOperator(session())).toBe(false);
    expect(isPlatformOperator(session({ user: { id: "u", platformAdmin: true } }))).toBe(true);
    expect(isPlatformRoot(key({ keyKind: "platform", keyGroup: "" }))).toBe(false);
    expect(isPlatformRoot(key({ keyKind: "root", keyGroup: "" }))).toBe(true);
  });

  it("lets a key see only its group and a session its memberships", () => {
    expect(visibleGroups(key())).toEqual(["acme"]);
    expect(visibleGroups(key({ keyGroup: "" }))).toEqual([]);
    expect(visibleGroups(session())).toEqual(["a-123456", "acme", "globex"]);
  });
});

describe("typedBodyValidator", () => {
  async function app() {
    const server = Fastify({ schemaController: { compilersFactory: { buildValidator: typedBodyValidator() } } });
    registerErrorHandling(server);
    server.get(
      "/items/:page",
      {
        schema: {
          params: { type: "object", properties: { page: { type: "integer" } } },
          querystring: { type: "object", properties: { limit: { type: "integer", minimum: 1 }, ratio: { type: "number" }, all: { type: "boolean" } } },
        },
      },
      async (request) => ({ params: request.params, query: request.query }),
    );
    return server;
  }

  it("reads numbers written plainly in a URL", async () => {
    const server = await app();
    const res = await server.inject("/items/2?limit=%2B05&ratio=0.5&all=true");
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ params: { page: 2 }, query: { limit: 5, ratio: 0.5, all: true } });
  });

  it("refuses hex, exponents, blanks and fractions where a whole number goes", async () => {
    const server = await app();
    for (const limit of ["0x10", "1e2", "%205", "5%20", "5.0", "", "Infinity"]) {
      const res = await server.inject(`/items/1?limit=${limit}`);
      expect(res.statusCode, limit).toBe(422);
      expect(res.json().detail.message, limit).toBe("querystring.limit must be integer.");
    }
    expect((await server.inject("/items/0x1")).json().detail.message).toBe("params.page must be integer.");
    expect((await server.inject("/items/1?ratio=1e3")).statusCode).toBe(422);
    expect((await server.inject("/items/1?limit=0")).json().detail.message).toBe("querystring.limit must be >= 1.");
  });
});
