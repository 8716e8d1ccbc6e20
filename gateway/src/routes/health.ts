import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { IdentityService } from "@platform/proto";
import { commonQuery } from "../schemas.ts";

export interface HealthDeps {
  identity: Client<typeof IdentityService>;
  environment: string;
  version: string;
}

export function healthRoutes(app: FastifyInstance, deps: HealthDeps): void {
  app.get(
    "/api/health",
    {
      config: { access: { public: true } },
      schema: {
        tags: ["health"],
        summary: "Liveness of the API; with deep=true also the database",
        security: [],
        querystring: {
          type: "object",
          properties: {
            deep: { type: "boolean", default: false, description: "Also report the database status and its table count." },
            environment: commonQuery.environment,
          },
        },
        response: {
          200: {
            type: "object",
            properties: {
              status: { type: "string", enum: ["ok", "degraded"] },
              environment: { type: "string" },
              version: { type: "string" },
              database: { type: "string", enum: ["ok", "unreachable"], description: "deep only: `ok` or `unreachable`; the reason is logged, never sent (the route needs no credential)." },
              tables: { type: ["integer", "null"], description: "deep only: tables in the platform database; null when it cannot be read." },
            },
            required: ["status", "environment", "version"],
          },
          422: { $ref: "Error#", description: "`deep` is not a boolean (`true` or `false`), or given more than once." },
        },
      },
    },
    async (request) => {
      const base = { status: "ok", environment: deps.environment, version: deps.version };
      if (!(request.query as { deep?: boolean }).deep) return base;
      try {
        const r = await deps.identity.readiness({ deep: true }, { timeoutMs: 3000 });
        const ok = r.database === "ok";
        // Anyone may ask: why the database cannot be read (hosts, users, ports) goes to the log only.
        if (!ok) request.log.warn({ database: r.database }, "deep health: the database cannot be read");
        return { ...base, status: ok ? "ok" : "degraded", database: ok ? "ok" : "unreachable", tables: ok ? r.tables : null };
      } catch (err) {
        request.log.warn({ err }, "deep health: identity did not answer");
        return { ...base, status: "degraded", database: "unreachable", tables: null };
      }
    },
  );
}
