/**
 * The OpenAPI document (validated by a real OpenAPI 3.1 validator), the docs page working with no
 * internet access, and one trace spanning gateway and identity, collected by an OTLP/HTTP
 * receiver on loopback that keeps the spans in memory.
 */
import http from "node:http";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Validator } from "@seriousme/openapi-schema-validator";
import { freePort, startTestFleet, type TestFleet } from "@platform/testing";
import { call } from "./support.ts";

interface ReceivedSpan {
  service: string;
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
}

/** OTLP ids arrive as hex in JSON; accept base64 too so the test does not hinge on the encoding. */
function hexId(id: string | undefined, bytes: number): string {
  if (!id) return "";
  if (new RegExp(`^[0-9a-f]{${bytes * 2}}$`).test(id)) return id;
  return Buffer.from(id, "base64").toString("hex");
}

function startOtlpReceiver(port: number) {
  const spans: ReceivedSpan[] = [];
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => (body += chunk));
    req.on("end", () => {
      if (req.url === "/v1/traces" && req.headers["content-type"]?.includes("json")) {
        const doc = JSON.parse(body) as {
          resourceSpans: Array<{
            resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> };
            scopeSpans: Array<{ spans: Array<{ traceId: string; spanId: string; parentSpanId?: string; name: string }> }>;
          }>;
        };
        for (const rs of doc.resourceSpans ?? []) {
          const service = rs.resource.attributes.find((a) => a.key === "service.name")?.value.stringValue ?? "";
          for (const ss of rs.scopeSpans ?? []) {
            for (const s of ss.spans ?? []) {
              spans.push({ service, traceId: hexId(s.traceId, 16), spanId: hexId(s.spanId, 8), parentSpanId: hexId(s.parentSpanId, 8), name: s.name });
            }
          }
        }
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    });
  });
  return { spans, server, listen: () => new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve)) };
}

let fleet: TestFleet;
let receiver: ReturnType<typeof startOtlpReceiver>;

beforeAll(async () => {
  const port = await freePort();
  receiver = startOtlpReceiver(port);
  await receiver.listen();
  fleet = await startTestFleet({ env: { OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}` } });
});

afterAll(async () => {
  await fleet?.stop();
  receiver?.server.close();
});

describe("OpenAPI document", () => {
  it("needs a credential", async () => {
    expect((await call(fleet.api, "GET", "/openapi.json")).status).toBe(401);
  });

  it("is a valid OpenAPI 3.1 document describing every route", async () => {
    const r = await call(fleet.api, "GET", "/openapi.json", { credential: fleet.rootKey });
    expect(r.status).toBe(200);
    const result = await new Validator().validate(r.body);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(r.body.openapi).toBe("3.1.0");
    const paths = r.body.paths as Record<string, Record<string, unknown>>;
    for (const [path, method] of [
      ["/api/health", "get"],
      ["/api/groups", "post"],
      ["/api/groups", "get"],
      ["/api/groups/{slug}", "patch"],
      ["/api/groups/{slug}", "delete"],
      ["/api/keys", "post"],
      ["/api/keys", "get"],
      ["/api/keys/{id}", "delete"],
      ["/api/auth/me", "get"],
      ["/api/auth/sessions", "get"],
      ["/api/auth/sessions/{id}", "delete"],
      ["/api/openapi.json", "get"],
    ] as const) {
      expect(paths[path]?.[method], `${method} ${path}`).toBeDefined();
    }
    expect(r.body.components.securitySchemes.credential).toMatchObject({ type: "http", scheme: "bearer" });
  });

  it("documents the request rules the gateway enforces", async () => {
    const r = await call(fleet.api, "GET", "/openapi.json", { credential: fleet.rootKey });
    const createKey = r.body.paths["/api/keys"].post;
    expect(createKey.requestBody.content["application/json"].schema.required).toEqual(["name", "scope"]);
    expect(createKey.requestBody.content["application/json"].schema.properties.scope.enum).toEqual(["read", "deploy", "admin"]);
    expect(Object.keys(createKey.responses)).toEqual(expect.arrayContaining(["201", "401", "403", "404", "422", "413", "415"]));
  });

  it("names every operation once, and requires a body only where the route refuses to go without one", async () => {
    const r = await call(fleet.api, "GET", "/openapi.json", { credential: fleet.rootKey });
    const ids: string[] = [];
    for (const operations of Object.values(r.body.paths as Record<string, Record<string, any>>)) {
      for (const op of Object.values(operations)) ids.push(op.operationId);
    }
    expect(ids.every((id) => typeof id === "string" && /^[a-z]+[A-Za-z0-9]+$/.test(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    expect(r.body.paths["/api/apps/{app_name}/redeploy"].post.operationId).toBe("postAppsByAppNameRedeploy");
    expect(r.body.paths["/api/apps/{app_name}/redeploy"].post.requestBody.required).toBe(false);
    expect(r.body.paths["/api/deployments/{deployment_id}/cancel"].post.requestBody.required).toBe(false);
    expect(r.body.paths["/api/keys"].post.requestBody.required).toBe(true);
  });

  it("lists among a route's answers every error status its text names, those the gateway gives before any route, and 413 and 415 wherever it reads a body", async () => {
    const r = await call(fleet.api, "GET", "/openapi.json", { credential: fleet.rootKey });
    const missing: string[] = [];
    for (const [path, operations] of Object.entries(r.body.paths as Record<string, Record<string, any>>)) {
      for (const [method, op] of Object.entries(operations)) {
        const codes = Object.keys(op.responses ?? {});
        const text = `${op.summary ?? ""} ${op.description ?? ""}`;
        // A status, not a count ("at most 500 variables").
        const named = [...text.matchAll(/\b([45]\d\d)\b(?! [a-z]+s\b)/g)].map((m) => m[1]!);
        const gateway = ["400", "431", ...(path === "/api/health" ? [] : ["401", "503"]), ...(["post", "put", "patch", "delete"].includes(method) ? ["413", "415"] : [])];
        for (const code of new Set([...named, ...gateway])) if (!codes.includes(code)) missing.push(`${method} ${path}: ${code}`);
      }
    }
    expect(missing).toEqual([]);
  });
});

describe("docs page", () => {
  it("is served without a credential, with the document inline and only local assets", async () => {
    const page = await fetch(`${fleet.api}/docs`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toContain("text/html");
    const html = await page.text();
    expect(html).toContain("SwaggerUIBundle");
    expect(html).toContain('"/api/keys"');
    const refs = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
    expect(refs.length).toBeGreaterThanOrEqual(3);
    for (const ref of refs) {
      expect(ref.startsWith("/api/docs/assets/"), ref).toBe(true);
      const asset = await fetch(new URL(ref, fleet.api));
      expect(asset.status, ref).toBe(200);
      expect((await asset.arrayBuffer()).byteLength).toBeGreaterThan(100);
    }
  });

  it("serves no file outside Swagger UI's own", async () => {
    expect((await fetch(`${fleet.api}/docs/assets/..%2F..%2Fpackage.json`)).status).toBe(404);
    expect((await fetch(`${fleet.api}/docs/assets/index.html`)).status).toBe(404);
  });
});

describe("tracing", () => {
  it("carries one trace from the gateway's request through the identity RPC and its statements", async () => {
    const created = await call(fleet.api, "POST", "/keys", { credential: fleet.rootKey, body: { name: "t", scope: "read", platform: true } });
    const traceId = randomBytes(16).toString("hex");
    const parent = randomBytes(8).toString("hex");
    // A key the gateway has not cached yet, so answering needs identity.
    const r = await call(fleet.api, "GET", "/auth/me", { credential: created.body.key, headers: { traceparent: `00-${traceId}-${parent}-01` } });
    expect(r.status).toBe(200);
    await expect
      .poll(() => new Set(receiver.spans.filter((s) => s.traceId === traceId).map((s) => s.service)), { timeout: 15_000, interval: 250 })
      .toEqual(new Set(["gateway", "identity"]));
    const trace = receiver.spans.filter((s) => s.traceId === traceId);
    const gatewayIds = new Set(trace.filter((s) => s.service === "gateway").map((s) => s.spanId));
    const identityServer = trace.find((s) => s.service === "identity" && s.name.endsWith("/VerifyCredential"));
    expect(identityServer, JSON.stringify(trace)).toBeDefined();
    expect(gatewayIds.has(identityServer!.parentSpanId)).toBe(true);
    expect(trace.some((s) => s.service === "gateway" && s.parentSpanId === parent)).toBe(true);
    // identity's statements are in it too (the pg instrumentation patched the driver at start).
    expect(trace.some((s) => s.service === "identity" && s.name.startsWith("pg.query:SELECT"))).toBe(true);
  });
});
