/**
 * The client side of the Connect protocol for unary calls over one HTTP/2 session per service:
 * a binary request body, `connect-timeout-ms` for the deadline, a binary message back on 200 and
 * a JSON error otherwise (https://connectrpc.com/docs/protocol). Every RPC of the fleet is unary,
 * and every API request makes at least one: the generic transport of `@connectrpc/connect-node`
 * runs each unary call through its streaming machinery (async iterables, linked abort
 * controllers, an error object built and dropped per call), which cost the gateway about a
 * third of its time per proxied request. Errors, headers and deadlines mean what they mean
 * there: the same `ConnectError` codes and details reach `platformErrorOf`.
 */
import http2 from "node:http2";
import { create, fromBinary, isMessage, toBinary, type DescMessage, type DescMethodStreaming, type DescMethodUnary, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type StreamResponse, type Transport, type UnaryResponse } from "@connectrpc/connect";
import { codeFromHttpStatus, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";

const { HTTP2_HEADER_STATUS, HTTP2_HEADER_CONTENT_TYPE } = http2.constants;
const TRAILER_PREFIX = "trailer-";
const PING_TIMEOUT_MS = 2_000;

export interface UnaryTransportOptions {
  baseUrl: string;
  /** Deadline of a call that sets none. */
  defaultTimeoutMs: number;
  /** Runs around every call (trace context, spans); it may add request headers. */
  around?: <T>(method: DescMethodUnary, header: Headers, call: () => Promise<T>) => Promise<T>;
}

export class UnaryTransport implements Transport {
  readonly #origin: string;
  readonly #pathPrefix: string;
  readonly #defaultTimeoutMs: number;
  readonly #around: NonNullable<UnaryTransportOptions["around"]>;
  #session: http2.ClientHttp2Session | null = null;
  /** Calls in flight per session: a session holds the process open only while it has some. */
  readonly #inFlight = new WeakMap<http2.ClientHttp2Session, number>();

  constructor(opts: UnaryTransportOptions) {
    const url = new URL(opts.baseUrl);
    this.#origin = url.origin;
    this.#pathPrefix = url.pathname.replace(/\/+$/, "");
    this.#defaultTimeoutMs = opts.defaultTimeoutMs;
    this.#around = opts.around ?? ((_m, _h, call) => call());
  }

  /** The session to the service, opened on first use and again after it went away. */
  #connect(): http2.ClientHttp2Session {
    const live = this.#session;
    if (live && !live.closed && !live.destroyed) return live;
    const session = http2.connect(this.#origin);
    const forget = () => {
      if (this.#session === session) this.#session = null;
    };
    session.on("error", forget);
    session.on("goaway", forget);
    session.on("close", forget);
    // An idle session must not keep a process from exiting; a call in flight holds it.
    session.unref();
    this.#session = session;
    return session;
  }

  /**
   * After a call timed out: a session whose peer went away without closing it (a host gone from
   * the network) would time every later call out too. It must answer a ping within
   * PING_TIMEOUT_MS, or it is dropped and the next call connects again.
   */
  #checkAlive(session: http2.ClientHttp2Session): void {
    if (session.destroyed || session.closed) return;
    const drop = () => {
      if (this.#session === session) this.#session = null;
      session.destroy();
    };
    const timer = setTimeout(drop, PING_TIMEOUT_MS);
    timer.unref();
    try {
      session.ping((err) => {
        clearTimeout(timer);
        if (err) drop();
      });
    } catch {
      clearTimeout(timer);
      drop();
    }
  }

  unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: ConstructorParameters<typeof Headers>[0] | undefined,
    input: MessageInitShape<I>,
  ): Promise<UnaryResponse<I, O>> {
    const requestHeader = new Headers(header);
    return this.#around(method as unknown as DescMethodUnary, requestHeader, () => this.#call(method, signal, timeoutMs ?? this.#defaultTimeoutMs, requestHeader, input));
  }

  #call<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number,
    requestHeader: Headers,
    input: MessageInitShape<I>,
  ): Promise<UnaryResponse<I, O>> {
    const message = isMessage(input, method.input) ? input : create(method.input, input);
    const body = toBinary(method.input, message);
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(ConnectError.from(signal.reason, Code.Canceled));
        return;
      }
      const outgoing: http2.OutgoingHttpHeaders = {
        ":method": "POST",
        ":path": `${this.#pathPrefix}/${method.parent.typeName}/${method.name}`,
        "content-type": "application/proto",
        "connect-protocol-version": "1",
        "connect-timeout-ms": String(timeoutMs),
      };
      requestHeader.forEach((value, key) => {
        outgoing[key] = value;
      });
      let session: http2.ClientHttp2Session;
      let stream: http2.ClientHttp2Stream;
      try {
        session = this.#connect();
        stream = session.request(outgoing);
      } catch (err) {
        reject(new ConnectError(`connecting to ${this.#origin}: ${err instanceof Error ? err.message : String(err)}`, Code.Unavailable));
        return;
      }
      const calls = this.#inFlight.get(session) ?? 0;
      this.#inFlight.set(session, calls + 1);
      if (calls === 0) session.ref();
      let settled = false;
      const settle = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        const left = (this.#inFlight.get(session) ?? 1) - 1;
        this.#inFlight.set(session, left);
        if (left === 0) session.unref();
        fn();
      };
      const fail = (err: ConnectError) =>
        settle(() => {
          if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
          reject(err);
        });
      const timer = setTimeout(() => {
        fail(new ConnectError("the operation timed out", Code.DeadlineExceeded));
        this.#checkAlive(session);
      }, timeoutMs);
      const onAbort = () => fail(ConnectError.from(signal?.reason, Code.Canceled));
      signal?.addEventListener("abort", onAbort, { once: true });

      let status = 0;
      const responseHeader = new Headers();
      const trailer = new Headers();
      const chunks: Buffer[] = [];
      stream.on("response", (h) => {
        status = Number(h[HTTP2_HEADER_STATUS]);
        for (const [key, value] of Object.entries(h)) {
          if (key.startsWith(":") || value === undefined) continue;
          const values = Array.isArray(value) ? value : [String(value)];
          for (const v of values) {
            if (key.startsWith(TRAILER_PREFIX)) trailer.append(key.slice(TRAILER_PREFIX.length), v);
            else responseHeader.append(key, v);
          }
        }
      });
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.on("error", (err) => fail(new ConnectError(`${method.name}: ${err.message}`, Code.Unavailable)));
      stream.on("close", () => {
        if (settled) return;
        const bytes = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
        if (status === 0) {
          fail(new ConnectError(`${method.name}: the stream closed without a response (code ${stream.rstCode})`, Code.Unavailable));
          return;
        }
        if (status !== 200) {
          const fallback = new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status), responseHeader);
          let err: ConnectError;
          try {
            err = errorFromJsonBytes(bytes, responseHeader, fallback);
          } catch (parsed) {
            err = parsed instanceof ConnectError ? parsed : fallback;
          }
          settle(() => reject(err));
          return;
        }
        const type = String(responseHeader.get(HTTP2_HEADER_CONTENT_TYPE) ?? "");
        if (type !== "application/proto") {
          settle(() => reject(new ConnectError(`unexpected response content type ${type}`, Code.Internal)));
          return;
        }
        let output;
        try {
          output = fromBinary(method.output, bytes);
        } catch (err) {
          settle(() => reject(new ConnectError(`parse binary: ${err instanceof Error ? err.message : String(err)}`, Code.Internal)));
          return;
        }
        settle(() => resolve({ stream: false, service: method.parent, method, header: responseHeader, message: output, trailer }));
      });
      stream.end(body);
    });
  }

  stream<I extends DescMessage, O extends DescMessage>(method: DescMethodStreaming<I, O>): Promise<StreamResponse<I, O>> {
    return Promise.reject(new ConnectError(`${method.name}: streaming calls are not used by the fleet`, Code.Unimplemented));
  }
}
