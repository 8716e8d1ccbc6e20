import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { IdentityService } from "@platform/proto";
import { callerOf } from "../access.ts";
import type { CredentialCache } from "../domain/credential-cache.ts";
import { authErrors, commonQuery } from "../schemas.ts";

export function authRoutes(app: FastifyInstance, identity: Client<typeof IdentityService>, cache: CredentialCache): void {
  app.get(
    "/api/auth/me",
    {
      config: { access: {} },
      schema: {
        tags: ["auth"],
        summary: "Who the credential stands for, the group it acts in and its scope there.",
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: {
              kind: { type: "string", enum: ["api_key", "session"] },
              scope: { type: "string", enum: ["read", "deploy", "admin", ""] },
              group_slug: { type: ["string", "null"], description: "The selected group; null when there is none (root key without ?group=)." },
              user: {
                type: ["object", "null"],
                properties: {
                  id: { type: "string" },
                  email: { type: "string" },
                  display_name: { type: "string" },
                  platform_admin: { type: "boolean" },
                  personal_group: { type: ["string", "null"] },
                },
              },
              memberships: {
                type: "array",
                items: { type: "object", properties: { group_slug: { type: "string" }, role: { type: "string" } } },
              },
              platform_operator: { type: "boolean" },
              platform_root: { type: "boolean" },
              key: {
                type: ["object", "null"],
                description: "API keys only.",
                properties: { id: { type: "string" }, kind: { type: "string", enum: ["group", "platform", "root"] } },
              },
              session: {
                type: ["object", "null"],
                description: "Sessions only.",
                properties: { id: { type: "string" }, kind: { type: "string", enum: ["browser", "cli"] } },
              },
            },
            required: ["kind", "scope", "group_slug", "user", "memberships", "platform_operator"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const p = request.principal!;
      const user = p.user;
      return {
        kind: p.kind,
        scope: caller.scope,
        group_slug: caller.selectedGroup || null,
        user: user
          ? { id: user.id, email: user.email, display_name: user.displayName, platform_admin: user.platformAdmin, personal_group: user.personalGroup || null }
          : null,
        memberships: p.memberships.map((m) => ({ group_slug: m.groupSlug, role: m.role })),
        platform_operator: caller.platformOperator,
        platform_root: caller.platformRoot,
        key: p.kind === "api_key" ? { id: p.id, kind: p.keyKind } : null,
        session: p.kind === "session" ? { id: p.id, kind: p.sessionKind } : null,
      };
    },
  );

  app.get(
    "/api/auth/sessions",
    {
      config: { access: { session: true } },
      schema: {
        tags: ["auth"],
        summary: "Your live sessions. Sessions only.",
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: {
              items: {
                type: "array",
                items: {
                  type: "object",
                  properties: {
                    id: { type: "string" },
                    kind: { type: "string", enum: ["browser", "cli"] },
                    created_at: { type: "string" },
                    last_used_at: { type: ["string", "null"] },
                    idle_expires_at: { type: "string" },
                    absolute_max_at: { type: "string" },
                    current: { type: "boolean", description: "The session making this request." },
                  },
                },
              },
              total: { type: "integer" },
            },
            required: ["items", "total"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const r = await identity.listSessions({ caller: callerOf(request) });
      return {
        items: r.items.map((s) => ({
          id: s.id,
          kind: s.kind,
          created_at: s.createdAt,
          last_used_at: s.lastUsedAt || null,
          idle_expires_at: s.idleExpiresAt,
          absolute_max_at: s.absoluteMaxAt,
          current: s.current,
        })),
        total: r.total,
      };
    },
  );

  app.delete(
    "/api/auth/sessions/:id",
    {
      config: { access: { session: true } },
      schema: {
        tags: ["auth"],
        summary: "Revoke one of your sessions.",
        querystring: { type: "object", properties: commonQuery },
        params: { type: "object", properties: { id: { type: "string" } }, required: ["id"] },
        response: { 204: { type: "null", description: "Revoked." }, ...authErrors },
      },
    },
    async (request, reply) => {
      const { id } = request.params as { id: string };
      await identity.revokeSession({ caller: callerOf(request), id });
      cache.invalidate(id);
      return reply.code(204).send();
    },
  );
}
