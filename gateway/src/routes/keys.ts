import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { ApiKey, IdentityService } from "@platform/proto";
import { callerOf } from "../access.ts";
import type { CredentialCache } from "../domain/credential-cache.ts";
import { authErrors, bodyErrors, commonQuery } from "../schemas.ts";

const orNull = (s: string) => (s === "" ? null : s);

const keyJson = (k: ApiKey) => ({
  id: k.id,
  prefix: k.prefix,
  name: k.name,
  scope: k.scope,
  group_slug: orNull(k.groupSlug),
  kind: k.kind,
  created_at: k.createdAt,
  last_used_at: orNull(k.lastUsedAt),
  revoked_at: orNull(k.revokedAt),
});

export function keyRoutes(app: FastifyInstance, identity: Client<typeof IdentityService>, cache: CredentialCache): void {
  app.post(
    "/api/keys",
    {
      config: { access: { scope: "admin" } },
      schema: {
        tags: ["keys"],
        summary: "Create an API key. The key is in this response only.",
        description:
          "A non-operator may create keys only for the group it acts in and at most with its own scope. " +
          "Operators may create keys for any group, or a legacy platform key with `platform: true`.",
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            name: { type: "string", description: "1-100 characters." },
            scope: { type: "string", enum: ["read", "deploy", "admin"] },
            group: { type: "string", description: "Group the key belongs to (alias `group_slug`, the name the key's answer uses); defaults to the group you act in." },
            group_slug: { type: "string", description: "Alias of `group`, as app registration accepts it; `group` wins when both are sent." },
            platform: { type: "boolean", default: false, description: "Operators only: a legacy platform key bound to no group." },
          },
          required: ["name", "scope"],
        },
        response: {
          201: {
            type: "object",
            properties: {
              id: { type: "string", format: "uuid" },
              key: { type: "string", description: "The API key (`pf_k1_...`). Shown once." },
              prefix: { type: "string" },
              name: { type: "string" },
              scope: { type: "string" },
              group_slug: { type: ["string", "null"] },
              created_at: { type: "string", format: "date-time" },
            },
            required: ["id", "key", "prefix", "name", "scope", "group_slug", "created_at"],
          },
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request, reply) => {
      const body = request.body as { name: string; scope: string; group?: string; group_slug?: string; platform?: boolean };
      const r = await identity.createKey({
        caller: callerOf(request),
        name: body.name,
        scope: body.scope,
        group: body.group ?? body.group_slug ?? "",
        platform: body.platform ?? false,
      });
      const k = r.key;
      // The one answer that carries the secret: no cache along the way may keep it.
      return reply.code(201).header("cache-control", "no-store").send({
        id: k?.id,
        key: r.secret,
        prefix: k?.prefix,
        name: k?.name,
        scope: k?.scope,
        group_slug: orNull(k?.groupSlug ?? ""),
        created_at: k?.createdAt,
      });
    },
  );

  app.get(
    "/api/keys",
    {
      config: { access: { scope: "admin" } },
      schema: {
        tags: ["keys"],
        summary: "List API keys of the group you act in (operators: all keys unless a group is selected).",
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: { items: { type: "array", items: { $ref: "ApiKey#" } }, total: { type: "integer" } },
            required: ["items", "total"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const r = await identity.listKeys({ caller: callerOf(request) });
      return { items: r.items.map(keyJson), total: r.total };
    },
  );

  app.delete(
    "/api/keys/:id",
    {
      config: { access: { scope: "admin" } },
      schema: {
        tags: ["keys"],
        summary: "Revoke an API key. From then on it answers 401 `Invalid or revoked API key`.",
        querystring: { type: "object", properties: commonQuery },
        params: { type: "object", properties: { id: { type: "string" } }, required: ["id"] },
        response: {
          204: { type: "null", description: "Revoked." },
          409: { $ref: "Error#", description: "`root_key_protected`: the root key is rotated through PLATFORM_ROOT_KEY." },
          ...authErrors,
        },
      },
    },
    async (request, reply) => {
      const { id } = request.params as { id: string };
      await identity.revokeKey({ caller: callerOf(request), id });
      // The revocation event reaches every replica; this one need not wait for it.
      cache.invalidate(id);
      return reply.code(204).send();
    },
  );
}
