import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { Group, IdentityService } from "@platform/proto";
import { callerOf } from "../access.ts";
import { authErrors, bodyErrors, commonQuery } from "../schemas.ts";

const groupJson = (g: Group) => ({ slug: g.slug, display_name: g.displayName, created_at: g.createdAt });

const slugParams = { type: "object", properties: { slug: { type: "string" } }, required: ["slug"] } as const;

export function groupRoutes(app: FastifyInstance, identity: Client<typeof IdentityService>): void {
  app.post(
    "/api/groups",
    {
      config: { access: { operator: true, scope: "admin" } },
      schema: {
        tags: ["groups"],
        summary: "Create a group (tenant). Platform operators only.",
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            slug: { type: "string", description: "1-63 lowercase letters, digits and hyphens." },
            display_name: { type: "string", maxLength: 200, description: "Defaults to the slug." },
          },
          required: ["slug"],
        },
        response: {
          201: { $ref: "Group#" },
          409: { $ref: "Error#", description: "`group_exists`: a group with this slug exists; `group_slug_reserved`: a group had it before a rename (the old slug stays reserved)." },
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request, reply) => {
      const body = request.body as { slug: string; display_name?: string };
      const group = await identity.createGroup({ caller: callerOf(request), slug: body.slug, displayName: body.display_name ?? "" });
      return reply.code(201).send(groupJson(group));
    },
  );

  app.get(
    "/api/groups",
    {
      config: { access: {} },
      schema: {
        tags: ["groups"],
        summary: "Groups you can see: all of them for operators, your memberships otherwise.",
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: { items: { type: "array", items: { $ref: "Group#" } }, total: { type: "integer" } },
            required: ["items", "total"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const r = await identity.listGroups({ caller: callerOf(request) });
      return { items: r.items.map(groupJson), total: r.total };
    },
  );

  app.patch(
    "/api/groups/:slug",
    {
      config: { access: { operator: true, scope: "admin" } },
      schema: {
        tags: ["groups"],
        summary: "Rename a group or change its display name. Platform operators only.",
        description:
          "The group keeps its identity: its apps, builds, deployments and logs follow it to the new slug, and its members and keys " +
          "act in it under the new slug. The old slug stays reserved to this group. A rename takes the group lock exclusively: " +
          "it waits a few seconds for registrations in the group to finish, then answers `group_busy`.",
        params: slugParams,
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            slug: { type: "string", description: "The new slug: 1-63 lowercase letters, digits and hyphens." },
            display_name: { type: "string", maxLength: 200, description: "Empty: back to the default, the slug." },
          },
          additionalProperties: false,
        },
        response: {
          200: { $ref: "Group#" },
          409: {
            $ref: "Error#",
            description:
              "`group_exists`: another group has the new slug; `group_slug_reserved`: another group had it before a rename; " +
              "`group_busy` (with `retry_after` in seconds): registrations or another change hold the group lock.",
          },
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request) => {
      const { slug } = request.params as { slug: string };
      const body = request.body as { slug?: string; display_name?: string };
      return groupJson(await identity.updateGroup({ caller: callerOf(request), slug, newSlug: body.slug, displayName: body.display_name }));
    },
  );

  app.delete(
    "/api/groups/:slug",
    {
      config: { access: { operator: true, scope: "admin" } },
      schema: {
        tags: ["groups"],
        summary: "Delete a group that owns no apps. Platform operators only.",
        description:
          "Its memberships and API keys go with it, and so do its deployment history and logs. A user's personal group cannot be deleted. " +
          "The delete takes the group lock exclusively, so no registration can add an app meanwhile.",
        params: slugParams,
        querystring: { type: "object", properties: commonQuery },
        response: {
          204: { type: "null", description: "Deleted." },
          409: {
            $ref: "Error#",
            description:
              "`group_has_apps` (with `app_count`): delete its apps first; `personal_group`: a user's personal group; " +
              "`group_busy` (with `retry_after` in seconds): registrations or another change hold the group lock.",
          },
          ...authErrors,
        },
      },
    },
    async (request, reply) => {
      const { slug } = request.params as { slug: string };
      await identity.deleteGroup({ caller: callerOf(request), slug });
      return reply.code(204).send();
    },
  );
}
