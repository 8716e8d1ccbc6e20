import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { IdentityService } from "@platform/proto";

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
            environment: { type: "string", description: "Legacy parameter: accepted and ignored." },
          },
        },
        response: {
          200: {
            type: "object",
            properties: {
              status: { type: "string", enum: ["ok", "degraded"] },
              environment: { type: "string" },
              version: { type: "string" },
              database: { type: "string", description: "deep only: `ok`, or why the database cannot be read." },
              tables: { type: ["integer", "null"], description: "deep only: tables in the platform database; null when it cannot be read." },
            },
            required: ["status", "environment", "version"],
          },
        },
      },
    },
    async (request) => {
      const base = { status: "ok", environment: deps.environment, version: deps.version };
      if (!(request.query as { deep?: boolean }).deep) return base;
      try {
        const r = await deps.identity.readiness({ deep: true }, { timeoutMs: 3000 });
        const ok = r.database === "ok";
        return { ...base, status: ok ? "ok" : "degraded", database: r.database, tables: ok ? r.tables : null };
      } catch (err) {
        return { ...base, status: "degraded", database: err instanceof Error ? err.message : "unreachable", tables: null };
      }
    },
  );
}
