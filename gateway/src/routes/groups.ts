import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { Group, IdentityService } from "@platform/proto";
import { callerOf } from "../access.ts";
import { authErrors, bodyErrors, commonQuery } from "../schemas.ts";

const groupJson = (g: Group) => ({ slug: g.slug, display_name: g.displayName, created_at: g.createdAt });

export function groupRoutes(app: FastifyInstance, identity: Client<typeof IdentityService>): void {
  app.post(
    "/api/groups",
    {
      config: { access: { operator: true } },
      schema: {
        tags: ["groups"],
        summary: "Create a group (tenant). Platform operators only.",
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            slug: { type: "string", description: "1-63 lowercase letters, digits and hyphens." },
            display_name: { type: "string" },
          },
          required: ["slug"],
        },
        response: {
          201: { $ref: "Group#" },
          409: { $ref: "Error#", description: "`group_exists`: a group with this slug exists." },
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
}
