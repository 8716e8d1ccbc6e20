/**
 * Connect RPC for the fleet: one server shape (HTTP/2 cleartext and HTTP/1.1 on one port, with
 * /healthz and /readyz beside the RPC routes), one client shape (unary calls over HTTP/2, a
 * deadline by default), and one mapping of errors in each direction.
 */
import { timingSafeEqual } from "node:crypto";
import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { DescMethodUnary, DescService } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createClient,
  type Client,
  type ConnectRouter,
  type Interceptor,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { PlatformError, fromConnectError, toConnectError } from "@platform/errors";
import type { Logger } from "@platform/logger";
import { SpanKind, extractTraceContext, injectTraceContext, withSpan } from "@platform/telemetry";
import { UnaryTransport } from "./unary-transport.ts";
import { recordingRouter, serveUnary, unaryRouteOf, type UnaryRoute } from "./unary-handler.ts";

/** Server side: trace context in, PlatformError out as a Connect error, nothing internal leaked. */
function serveCall<T>(logger: Logger, service: DescService, method: { name: string }, header: Headers, call: () => Promise<T>): Promise<T> {
  return withSpan(
    `${service.typeName}/${method.name}`,
    { kind: SpanKind.SERVER, parent: extractTraceContext(header), attributes: { "rpc.system": "connect_rpc", "rpc.service": service.typeName, "rpc.method": method.name } },
    async () => {
      try {
        return await call();
      } catch (err) {
        if (err instanceof PlatformError) throw toConnectError(err);
        if (err instanceof ConnectError) throw err;
        logger.error({ err, rpc: method.name }, "unhandled error in RPC handler");
        throw new ConnectError("Internal server error.", Code.Internal);
      }
    },
  );
}

function serverInterceptor(logger: Logger): Interceptor {
  return (next) => (req) => serveCall(logger, req.service, req.method, req.header, () => next(req));
}

/**
 * Client side: a client span and trace context out. Errors stay ConnectErrors (Connect would
 * re-wrap anything else and lose the detail); `platformErrorOf` turns them back at the edge.
 */
function aroundClientCall<T>(method: DescMethodUnary, header: Headers, call: () => Promise<T>): Promise<T> {
  return withSpan(
    `${method.parent.typeName}/${method.name}`,
    { kind: SpanKind.CLIENT, attributes: { "rpc.system": "connect_rpc", "rpc.service": method.parent.typeName, "rpc.method": method.name } },
    async () => {
      injectTraceContext(header);
      return call();
    },
  );
}

/** The platform error behind anything an RPC client threw. */
export function platformErrorOf(err: unknown): PlatformError | null {
  if (err instanceof PlatformError) return err;
  if (err instanceof ConnectError) return fromConnectError(err);
  return null;
}

export interface ReadinessFacts {
  ready: boolean;
  [key: string]: unknown;
}

/** The header value every internal call carries when the fleet has an internal token. */
function bearer(token: string): string {
  return `Bearer ${token}`;
}

/** Whether a request's Authorization header is `wanted` (the bearer of the fleet's token), compared in constant time. */
function authorized(header: string | string[] | undefined, wanted: Buffer): boolean {
  const given = Buffer.from(typeof header === "string" ? header : "");
  return given.length === wanted.length && timingSafeEqual(given, wanted);
}

export interface RpcServerOptions {
  port: number;
  host: string;
  /**
   * The fleet's internal token (PLATFORM_INTERNAL_TOKEN): a call without it is refused as
   * unauthenticated. Services trust the Caller a call carries, so without the token anything
   * that reaches the port (tenant code on an agent's host, say) could act as any caller.
   */
  token?: string;
  routes: (router: ConnectRouter) => void;
  readiness: () => Promise<ReadinessFacts>;
  logger: Logger;
}

export interface RpcServer {
  port: number;
  close(): Promise<void>;
}

const HTTP2_PREFACE = "PRI * HTTP/2.0";

/**
 * Serves Connect on one port for both h2c (prior knowledge, what Connect and gRPC clients use)
 * and HTTP/1.1 (what probes and curl use). Node's cleartext HTTP/2 server cannot fall back to
 * HTTP/1.1 by itself, so the first bytes of each connection decide which server takes it.
 */
export async function startRpcServer(opts: RpcServerOptions): Promise<RpcServer> {
  const unaryRoutes = new Map<string, UnaryRoute>();
  const wantedAuthorization = opts.token ? Buffer.from(bearer(opts.token)) : null;
  const rpcHandler = connectNodeAdapter({
    routes: (router) => opts.routes(recordingRouter(router, unaryRoutes)),
    interceptors: [serverInterceptor(opts.logger)],
    grpc: true,
    grpcWeb: false,
  });
  const handle = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => {
    const path = req.url?.split("?")[0];
    if (req.method === "GET" && (path === "/healthz" || path === "/readyz")) {
      const respond = (status: number, body: unknown) => {
        (res as http.ServerResponse).writeHead(status, { "content-type": "application/json", "cache-control": "no-store" });
        (res as http.ServerResponse).end(JSON.stringify(body));
      };
      if (path === "/healthz") return respond(200, { status: "ok" });
      opts.readiness().then(
        (facts) => respond(facts.ready ? 200 : 503, facts),
        (err: unknown) => respond(503, { ready: false, error: err instanceof Error ? err.message : String(err) }),
      );
      return;
    }
    if (wantedAuthorization && !authorized(req.headers.authorization, wantedAuthorization)) {
      // Connect's error shape, which the fleet's clients read as ConnectError Unauthenticated.
      (res as http.ServerResponse).writeHead(401, { "content-type": "application/json" });
      (res as http.ServerResponse).end(JSON.stringify({ code: "unauthenticated", message: "This call lacks the fleet's internal token (PLATFORM_INTERNAL_TOKEN)." }));
      return;
    }
    const unary = unaryRouteOf(req, unaryRoutes);
    if (unary) {
      void serveUnary(req, res, unary, (route, header, call) => serveCall(opts.logger, route.service, route.method, header, call));
      return;
    }
    rpcHandler(req as http.IncomingMessage, res as http.ServerResponse);
  };
  const h1 = http.createServer(handle);
  const h2 = http2.createServer({}, handle);
  const sockets = new Set<net.Socket>();
  // Small HTTP/2 frames must not wait for Nagle: a raw net server does not set TCP_NODELAY by itself.
  const front = net.createServer({ noDelay: true }, (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.once("readable", () => {
      const head = socket.read(HTTP2_PREFACE.length) as Buffer | null;
      if (head === null) {
        // Fewer bytes than the preface so far: it is not HTTP/2 prior knowledge.
        const rest = socket.read() as Buffer | null;
        if (rest) socket.unshift(rest);
        h1.emit("connection", socket);
        return;
      }
      socket.unshift(head);
      (head.toString("latin1") === HTTP2_PREFACE ? h2 : h1).emit("connection", socket);
    });
  });
  await new Promise<void>((resolve, reject) => {
    front.once("error", reject);
    front.listen(opts.port, opts.host, () => resolve());
  });
  const address = front.address() as net.AddressInfo;
  return {
    port: address.port,
    async close() {
      await new Promise<void>((resolve) => {
        front.close(() => resolve());
        h1.closeIdleConnections();
        setTimeout(() => {
          for (const s of sockets) s.destroy();
        }, 2000).unref();
      });
    },
  };
}

export interface ClientOptions {
  /** Deadline of every call unless the call sets its own. */
  timeoutMs?: number;
  /** The fleet's internal token (PLATFORM_INTERNAL_TOKEN), sent with every call. */
  token?: string;
}

export function createServiceClient<S extends DescService>(service: S, baseUrl: string, options: ClientOptions = {}): Client<S> {
  const token = options.token;
  const around: typeof aroundClientCall = token
    ? (method, header, call) => {
        header.set("authorization", bearer(token));
        return aroundClientCall(method, header, call);
      }
    : aroundClientCall;
  return createClient(service, new UnaryTransport({ baseUrl, defaultTimeoutMs: options.timeoutMs ?? 5000, around }));
}
