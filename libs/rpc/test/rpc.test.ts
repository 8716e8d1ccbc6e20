import http2 from "node:http2";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { context, propagation, trace, SpanKind, SpanStatusCode, type SpanContext } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter, createConnectTransport } from "@connectrpc/connect-node";
import { HooksService, ReadinessResponseSchema, type ReadinessRequest } from "@platform/proto";
import { PlatformError } from "@platform/errors";
import type { Logger } from "@platform/logger";
import { createServiceClient, platformErrorOf, startRpcServer, type ReadinessFacts, type RpcServer } from "../src/index.ts";

// An in-process tracer provider, so spans and their parents can be inspected.
const exporter = new InMemorySpanExporter();
const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
propagation.setGlobalPropagator(new W3CTraceContextPropagator());
trace.setGlobalTracerProvider(provider);
const testTracer = trace.getTracer("rpc-test");

const errors: Array<{ obj: unknown; msg?: string }> = [];
const logger = {
  error: (obj: unknown, msg?: string) => void errors.push({ obj, msg }),
  warn: () => undefined,
  info: () => undefined,
  debug: () => undefined,
} as unknown as Logger;

/** What the handler observed of the last call in each mode. */
const observed: { traceparent?: string | null; active?: SpanContext; aborted?: boolean } = {};

async function readinessHandler(req: ReadinessRequest, ctx: HandlerContext) {
  switch (ctx.requestHeader.get("x-test-mode")) {
    case "conflict":
      throw PlatformError.conflict({ code: "x", message: "m", holder: "deploy-7" });
    case "secret":
      throw new Error("secret internals: password=hunter2 at /srv/app/db.ts:12");
    case "hang":
      observed.aborted = false;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 20_000);
        ctx.signal.addEventListener("abort", () => {
          observed.aborted = true;
          clearTimeout(timer);
          resolve();
        });
      });
      throw new Error("should have been cancelled");
    case "trace":
      observed.traceparent = ctx.requestHeader.get("traceparent");
      observed.active = trace.getActiveSpan()?.spanContext();
      break;
  }
  return create(ReadinessResponseSchema, { service: "hooks", ready: true, database: "ok", tables: req.deep ? 7 : 0 });
}

let readiness: () => Promise<ReadinessFacts> = async () => ({ ready: true, service: "hooks" });
let server: RpcServer;
let base: string;

beforeAll(async () => {
  server = await startRpcServer({
    port: 0,
    host: "127.0.0.1",
    routes: (router) => router.service(HooksService, { readiness: readinessHandler }),
    readiness: () => readiness(),
    logger,
  });
  base = `http://127.0.0.1:${server.port}`;
});

afterAll(async () => {
  await server?.close();
  await provider.shutdown();
  trace.disable();
  propagation.disable();
  context.disable();
});

/** Runs `fn` and returns what it threw. */
async function thrown(fn: () => Promise<unknown>): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  throw new Error("expected the call to fail");
}

/** One request over a raw HTTP/2 (prior knowledge) connection. */
function h2request(headers: http2.OutgoingHttpHeaders, body?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(base);
    session.on("error", reject);
    const req = session.request(headers);
    let status = 0;
    let data = "";
    req.setEncoding("utf8");
    req.on("response", (h) => (status = Number(h[":status"])));
    req.on("data", (chunk: string) => (data += chunk));
    req.on("end", () => {
      session.close();
      resolve({ status, body: data });
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe("the RPC server", () => {
  it("answers a Connect client over HTTP/2", async () => {
    const client = createServiceClient(HooksService, base);
    const res = await client.readiness({ deep: true });
    expect(res.service).toBe("hooks");
    expect(res.ready).toBe(true);
    expect(res.tables).toBe(7);
    expect((await client.readiness({ deep: false })).tables).toBe(0);
  });

  it("serves RPCs over both HTTP/2 prior knowledge and HTTP/1.1 on the one port", async () => {
    const path = `/${HooksService.typeName}/Readiness`;
    const viaH2 = await h2request({ ":method": "POST", ":path": path, "content-type": "application/json" }, JSON.stringify({ deep: true }));
    expect(viaH2.status).toBe(200);
    expect(JSON.parse(viaH2.body)).toMatchObject({ service: "hooks", ready: true, tables: 7 });
    const viaH1 = await fetch(`${base}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(viaH1.status).toBe(200);
    expect(await viaH1.json()).toMatchObject({ service: "hooks", ready: true });
  });

  it("speaks the Connect protocol both ways with connect-node's own client and server", async () => {
    // connect-node's client against this server's unary fast path, errors and their detail included.
    const theirs = createClient(HooksService, createConnectTransport({ baseUrl: base, httpVersion: "2", useBinaryFormat: true }));
    expect((await theirs.readiness({ deep: true })).tables).toBe(7);
    const refused = await thrown(() => theirs.readiness({}, { headers: { "x-test-mode": "conflict" } }));
    expect(platformErrorOf(refused)!.detail).toEqual({ code: "x", message: "m", holder: "deploy-7" });

    // This client against a server that is connect-node's adapter alone.
    const plain = http2.createServer(connectNodeAdapter({ routes: (router) => router.service(HooksService, { readiness: readinessHandler }) }));
    await new Promise<void>((resolve) => plain.listen(0, "127.0.0.1", resolve));
    try {
      const ours = createServiceClient(HooksService, `http://127.0.0.1:${(plain.address() as net.AddressInfo).port}`);
      expect((await ours.readiness({ deep: true })).tables).toBe(7);
      const err = await thrown(() => ours.readiness({}, { headers: { "x-test-mode": "conflict" } }));
      expect((err as ConnectError).code).toBe(Code.Internal);
    } finally {
      await new Promise<void>((resolve) => plain.close(() => resolve()));
    }
  });

  it("answers /healthz and /readyz over plain HTTP/1.1 following the readiness callback", async () => {
    const health = await fetch(`${base}/healthz`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: "ok" });
    expect((await fetch(`${base}/healthz?probe=k8s`)).status).toBe(200);

    readiness = async () => ({ ready: true, service: "hooks", database: "ok" });
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(200);
    expect(ready.headers.get("cache-control")).toBe("no-store");
    expect(await ready.json()).toEqual({ ready: true, service: "hooks", database: "ok" });

    readiness = async () => ({ ready: false, service: "hooks", database: "connection refused" });
    const notReady = await fetch(`${base}/readyz`);
    expect(notReady.status).toBe(503);
    expect(await notReady.json()).toEqual({ ready: false, service: "hooks", database: "connection refused" });

    readiness = async () => {
      throw new Error("nats closed");
    };
    const failing = await fetch(`${base}/readyz`);
    expect(failing.status).toBe(503);
    expect(await failing.json()).toEqual({ ready: false, error: "nats closed" });

    // Liveness does not depend on readiness.
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    readiness = async () => ({ ready: true, service: "hooks" });
  });

  it("answers /readyz over HTTP/2 too", async () => {
    readiness = async () => ({ ready: false, service: "hooks" });
    const res = await h2request({ ":method": "GET", ":path": "/readyz" });
    expect(res.status).toBe(503);
    expect(JSON.parse(res.body)).toEqual({ ready: false, service: "hooks" });
    readiness = async () => ({ ready: true, service: "hooks" });
  });

  it("carries a PlatformError to the client with its status and detail", async () => {
    const client = createServiceClient(HooksService, base);
    const err = await thrown(() => client.readiness({}, { headers: { "x-test-mode": "conflict" } }));
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.FailedPrecondition);
    const platform = platformErrorOf(err);
    expect(platform).toBeInstanceOf(PlatformError);
    expect(platform!.status).toBe(409);
    expect(platform!.detail).toEqual({ code: "x", message: "m", holder: "deploy-7" });
  });

  it("turns an unexpected error into a 500 without leaking it, and logs it", async () => {
    const client = createServiceClient(HooksService, base);
    errors.length = 0;
    const err = await thrown(() => client.readiness({}, { headers: { "x-test-mode": "secret" } }));
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.Internal);
    expect(JSON.stringify(err)).not.toContain("secret");
    expect((err as ConnectError).message).not.toContain("secret");
    expect((err as ConnectError).message).not.toContain("hunter2");
    const platform = platformErrorOf(err);
    expect(platform!.status).toBe(500);
    expect(platform!.detail).toBe("Internal server error.");
    // The operator still sees what went wrong.
    expect(errors).toHaveLength(1);
    expect(String((errors[0]!.obj as { err: Error }).err.message)).toContain("secret internals");
    // The server span records the failure.
    const failed = exporter
      .getFinishedSpans()
      .filter((s) => s.kind === SpanKind.SERVER && s.status.code === SpanStatusCode.ERROR);
    expect(failed.length).toBeGreaterThan(0);
  });

  it("gives a 504 to a client whose deadline passes, and cancels the handler", async () => {
    const client = createServiceClient(HooksService, base, { timeoutMs: 300 });
    const started = Date.now();
    const err = await thrown(() => client.readiness({}, { headers: { "x-test-mode": "hang" } }));
    expect(Date.now() - started).toBeLessThan(3_000);
    expect((err as ConnectError).code).toBe(Code.DeadlineExceeded);
    const platform = platformErrorOf(err);
    expect(platform!.status).toBe(504);
    expect(platform!.detail).toBe("A platform service did not answer in time.");
    await expect.poll(() => observed.aborted, { timeout: 5_000 }).toBe(true);
  });

  it("has a deadline even when the client sets none", async () => {
    const client = createServiceClient(HooksService, base);
    const started = Date.now();
    const err = await thrown(() => client.readiness({}, { headers: { "x-test-mode": "hang" } }));
    const elapsed = Date.now() - started;
    expect(platformErrorOf(err)!.status).toBe(504);
    expect(elapsed).toBeGreaterThanOrEqual(4_500);
    expect(elapsed).toBeLessThan(8_000);
  });

  it("gives a 503 when the service is not there", async () => {
    const closed = net.createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const client = createServiceClient(HooksService, `http://127.0.0.1:${port}`, { timeoutMs: 2_000 });
    const err = await thrown(() => client.readiness({}));
    const platform = platformErrorOf(err);
    expect(platform!.status).toBe(503);
    expect(platform!.detail).toBe("A platform service is unavailable.");
    expect(platformErrorOf(new Error("not an rpc error"))).toBeNull();
  });

  it("drops a session whose peer stopped answering after a call timed out, and connects again", async () => {
    // A relay that can silence the connections it carries without closing them: a host gone
    // from the network, whose sockets nobody resets.
    const silenced = new Set<net.Socket>();
    const relay = net.createServer((downstream) => {
      const upstream = net.connect(server.port, "127.0.0.1");
      const pass = (from: net.Socket, to: net.Socket) => from.on("data", (chunk) => !silenced.has(downstream) && to.write(chunk));
      pass(downstream, upstream);
      pass(upstream, downstream);
      const end = () => {
        downstream.destroy();
        upstream.destroy();
      };
      downstream.on("error", end).on("close", end);
      upstream.on("error", end).on("close", end);
      connections.add(downstream);
    });
    const connections = new Set<net.Socket>();
    await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
    try {
      const client = createServiceClient(HooksService, `http://127.0.0.1:${(relay.address() as net.AddressInfo).port}`, { timeoutMs: 300 });
      expect((await client.readiness({})).ready).toBe(true);
      for (const c of connections) silenced.add(c);
      expect(platformErrorOf(await thrown(() => client.readiness({})))!.status).toBe(504);
      // The session did not answer its ping: the next call opens a new connection, which works.
      await expect.poll(async () => (await client.readiness({}).catch(() => null))?.ready ?? false, { timeout: 8_000, interval: 500 }).toBe(true);
      expect(connections.size).toBe(2);
    } finally {
      for (const c of connections) c.destroy();
      await new Promise<void>((resolve) => relay.close(() => resolve()));
    }
  });

  it("continues the caller's trace: the server span is the child of the client span", async () => {
    const client = createServiceClient(HooksService, base);
    const root = await testTracer.startActiveSpan("GET /api/health", async (span) => {
      await client.readiness({}, { headers: { "x-test-mode": "trace" } });
      span.end();
      return span.spanContext();
    });
    const name = `${HooksService.typeName}/Readiness`;
    const ofCall = () => exporter.getFinishedSpans().filter((s) => s.name === name && s.spanContext().traceId === root.traceId);
    await expect.poll(() => ofCall().length, { timeout: 5_000 }).toBe(2);
    const spans = ofCall();
    const clientSpan = spans.find((s) => s.name === name && s.kind === SpanKind.CLIENT)!;
    const serverSpan = spans.find((s) => s.name === name && s.kind === SpanKind.SERVER)!;
    expect(clientSpan).toBeDefined();
    expect(serverSpan).toBeDefined();

    expect(clientSpan.spanContext().traceId).toBe(root.traceId);
    expect(clientSpan.parentSpanContext?.spanId).toBe(root.spanId);
    expect(serverSpan.spanContext().traceId).toBe(clientSpan.spanContext().traceId);
    expect(serverSpan.parentSpanContext?.spanId).toBe(clientSpan.spanContext().spanId);
    // The parent came over the wire, not through this process's async context.
    expect(serverSpan.parentSpanContext?.isRemote).toBe(true);
    expect(observed.traceparent).toBe(`00-${root.traceId}-${clientSpan.spanContext().spanId}-01`);
    expect(observed.active?.spanId).toBe(serverSpan.spanContext().spanId);
    expect(serverSpan.attributes["rpc.method"]).toBe("Readiness");
  });
});

describe("the fleet's internal token", () => {
  let guarded: RpcServer;
  let url: string;
  beforeAll(async () => {
    guarded = await startRpcServer({
      port: 0,
      host: "127.0.0.1",
      token: "internal-secret",
      routes: (router) => router.service(HooksService, { readiness: readinessHandler }),
      readiness: async () => ({ ready: true }),
      logger,
    });
    url = `http://127.0.0.1:${guarded.port}`;
  });
  afterAll(() => guarded?.close());

  it("answers a client that sends it, and refuses one without it or with another as unauthenticated", async () => {
    expect((await createServiceClient(HooksService, url, { token: "internal-secret" }).readiness({})).ready).toBe(true);
    for (const token of [undefined, "internal-secreT", "internal-secret-and-more"]) {
      const err = await thrown(() => createServiceClient(HooksService, url, { token }).readiness({}));
      expect(err, String(token)).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.Unauthenticated);
    }
  });

  it("refuses a raw HTTP/1.1 call without it too, and keeps /healthz and /readyz open for probes", async () => {
    const raw = await fetch(`${url}/${HooksService.typeName}/Readiness`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(raw.status).toBe(401);
    expect(await raw.json()).toMatchObject({ code: "unauthenticated" });
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
  });
});
