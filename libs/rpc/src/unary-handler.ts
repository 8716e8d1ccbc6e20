/**
 * The server side of the Connect protocol's unary calls in binary, the form every client of the
 * fleet sends (`UnaryTransport`): the request body decoded, the service's own implementation
 * called with a Connect handler context, the answer or a Connect JSON error written back.
 * connect-node's adapter runs each unary call through its streaming machinery, which cost a
 * service as much as the work behind it; it still serves every other form (JSON, gRPC, GET).
 */
import type http from "node:http";
import type http2 from "node:http2";
import { create, fromBinary, isMessage, toBinary, type DescMessage, type DescMethod, type DescMethodUnary, type DescService } from "@bufbuild/protobuf";
import { Code, ConnectError, createHandlerContext, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { codeToHttpStatus, errorToJsonBytes, parseTimeout } from "@connectrpc/connect/protocol-connect";

type Impl = (request: unknown, context: HandlerContext) => unknown;

/** Why a finished call's context is aborted: given, so that no DOMException is made per call. */
const FINISHED = new ConnectError("the call has finished", Code.Canceled);

export interface UnaryRoute {
  service: DescService;
  method: DescMethodUnary;
  impl: Impl;
}

/** Settles a call: the handler's answer, or the error it threw (the caller maps it). */
export type CallRunner = (route: UnaryRoute, header: Headers, call: () => Promise<unknown>) => Promise<unknown>;

/**
 * A router that records the unary implementations it is given, by request path, and hands every
 * registration on to connect-node's router unchanged.
 */
export function recordingRouter(router: ConnectRouter, routes: Map<string, UnaryRoute>): ConnectRouter {
  const record = (service: DescService, method: DescMethod, impl: unknown) => {
    if (method.methodKind !== "unary" || typeof impl !== "function") return;
    routes.set(`/${service.typeName}/${method.name}`, { service, method: method as DescMethodUnary, impl: impl as Impl });
  };
  const recorder: ConnectRouter = {
    get handlers() {
      return router.handlers;
    },
    service(service, impl, options) {
      for (const method of service.methods) {
        const fn = (impl as Record<string, unknown>)[method.localName];
        record(service, method, typeof fn === "function" ? fn.bind(impl) : undefined);
      }
      router.service(service, impl, options);
      return recorder;
    },
    rpc(method, impl, options) {
      record(method.parent, method, impl);
      router.rpc(method, impl, options);
      return recorder;
    },
  };
  return recorder;
}

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

/** The route a request takes on the fast path, or null when connect-node's adapter should serve it. */
export function unaryRouteOf(req: Request, routes: Map<string, UnaryRoute>): UnaryRoute | null {
  if (req.method !== "POST" || req.headers["content-type"] !== "application/proto") return null;
  const encoding = req.headers["content-encoding"];
  if (encoding !== undefined && encoding !== "identity") return null;
  const path = req.url?.split("?")[0];
  return path === undefined ? null : (routes.get(path) ?? null);
}

function headersOf(req: Request): Headers {
  const out = new Headers();
  for (const [key, value] of Object.entries(req.headers)) {
    if (key.startsWith(":") || value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) out.append(key, v);
    else out.append(key, value);
  }
  return out;
}

function readBody(req: Request): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.once("end", () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    req.once("error", reject);
  });
}

function writeError(res: Response, err: ConnectError): void {
  if (res.headersSent || res.writableEnded) return;
  const head: Record<string, string> = { "content-type": "application/json" };
  err.metadata.forEach((value, key) => {
    head[key] = value;
  });
  const body = errorToJsonBytes(err, {});
  (res as http.ServerResponse).writeHead(codeToHttpStatus(err.code), head);
  (res as http.ServerResponse).end(body);
}

export async function serveUnary(req: Request, res: Response, route: UnaryRoute, run: CallRunner): Promise<void> {
  const header = headersOf(req);
  const timeout = parseTimeout(header.get("connect-timeout-ms"), Number.MAX_SAFE_INTEGER);
  if (timeout.error) return writeError(res, timeout.error);
  const requestAbort = new AbortController();
  const onClose = () => requestAbort.abort(new ConnectError("the client went away", Code.Canceled));
  res.once("close", onClose);
  const ctx = createHandlerContext({
    service: route.service,
    method: route.method as DescMethod,
    protocolName: "connect",
    requestMethod: "POST",
    url: req.url ?? "",
    timeoutMs: timeout.timeoutMs,
    requestSignal: requestAbort.signal,
    requestHeader: header,
  });
  try {
    let input: unknown;
    try {
      input = fromBinary(route.method.input, await readBody(req));
    } catch (err) {
      throw new ConnectError(`parse binary: ${err instanceof Error ? err.message : String(err)}`, Code.InvalidArgument);
    }
    // A handler that outlives the deadline is cancelled through its signal, and the caller told at once.
    const aborted = new Promise<never>((_, reject) => {
      const fail = () => reject(ConnectError.from(ctx.signal.reason, Code.DeadlineExceeded));
      if (ctx.signal.aborted) fail();
      else ctx.signal.addEventListener("abort", fail, { once: true });
    });
    aborted.catch(() => undefined);
    const result = await run(route, header, () => Promise.race([Promise.resolve(route.impl(input, ctx)), aborted]));
    const output = isMessage(result, route.method.output as DescMessage) ? result : create(route.method.output, result as never);
    const body = toBinary(route.method.output, output);
    const head: Record<string, string> = { "content-type": "application/proto" };
    ctx.responseHeader.forEach((value, key) => {
      head[key] = value;
    });
    ctx.responseTrailer.forEach((value, key) => {
      head[`trailer-${key}`] = value;
    });
    if (res.writableEnded) return;
    (res as http.ServerResponse).writeHead(200, head);
    (res as http.ServerResponse).end(body);
  } catch (err) {
    writeError(res, ConnectError.from(err));
  } finally {
    res.off("close", onClose);
    ctx.abort(FINISHED);
  }
}
