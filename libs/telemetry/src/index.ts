/**
 * Trace context helpers for the carriers that have no auto-instrumentation here: Connect calls
 * over HTTP/2 and NATS message headers. Both use W3C `traceparent`.
 */
import {
  context,
  propagation,
  trace,
  SpanKind,
  SpanStatusCode,
  type Attributes,
  type Context,
  type Span,
} from "@opentelemetry/api";

export { startTelemetry, shutdownTelemetry } from "./sdk.ts";
export { SpanKind, context, trace };

export const tracer = trace.getTracer("platform");

export interface HeaderCarrier {
  set(key: string, value: string): void;
  get(key: string): string | null | undefined;
}

const carrierSetter = { set: (c: HeaderCarrier, k: string, v: string) => c.set(k, v) };
const carrierGetter = {
  get: (c: HeaderCarrier, k: string) => c.get(k) || undefined,
  keys: () => ["traceparent", "tracestate", "baggage"],
};

export function injectTraceContext(carrier: HeaderCarrier, ctx: Context = context.active()): void {
  propagation.inject(ctx, carrier, carrierSetter);
}

export function extractTraceContext(carrier: HeaderCarrier): Context {
  return propagation.extract(context.active(), carrier, carrierGetter);
}

/**
 * Runs `fn` inside a span that ends with the promise, ERROR status and `error.type` on a throw.
 * `links` join work done for several traces at once (a batch of messages) to each of them.
 */
export async function withSpan<T>(
  name: string,
  options: { kind?: SpanKind; attributes?: Attributes; parent?: Context; links?: Context[] },
  fn: (span: Span) => Promise<T>,
): Promise<T> {
  const parent = options.parent ?? context.active();
  const links = options.links?.flatMap((c) => {
    const linked = trace.getSpanContext(c);
    return linked ? [{ context: linked }] : [];
  });
  return tracer.startActiveSpan(name, { kind: options.kind ?? SpanKind.INTERNAL, attributes: options.attributes, links }, parent, async (span) => {
    try {
      return await fn(span);
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
      span.setAttribute("error.type", err instanceof Error ? err.name : "Error");
      throw err;
    } finally {
      span.end();
    }
  });
}
