import { NodeSDK } from "@opentelemetry/sdk-node";
import { AlwaysOffSampler, BatchSpanProcessor, ParentBasedSampler, AlwaysOnSampler, type SpanProcessor } from "@opentelemetry/sdk-trace";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { HttpInstrumentation } from "@opentelemetry/instrumentation-http";
import { UndiciInstrumentation } from "@opentelemetry/instrumentation-undici";
import { PgInstrumentation } from "@opentelemetry/instrumentation-pg";
import fastifyOtel from "@fastify/otel";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";

const SDK_KEY = Symbol.for("platform.telemetry.sdk");

/**
 * Probe endpoints are not traced: load balancers and orchestrators call them every few seconds,
 * and their spans would drown the traces people look for (and slow the probes down).
 */
const PROBE_PATHS = new Set(["/api/health", "/healthz", "/readyz"]);
function isProbe(url: string | undefined): boolean {
  if (!url) return false;
  const query = url.indexOf("?");
  return PROBE_PATHS.has(query < 0 ? url : url.slice(0, query));
}
type Holder = { [SDK_KEY]?: NodeSDK };

/**
 * The modules whose ESM imports the loader hook wraps, so the instrumentations below can patch
 * them: node's http and https (HttpInstrumentation) and pg (PgInstrumentation). Undici and
 * Fastify are observed through diagnostics channels and need no wrapping.
 */
export const INSTRUMENTED_MODULES = ["http", "https", "pg", "pg-pool"];

/** The service name comes from OTEL_SERVICE_NAME, which the fleet runner and deploy files set. */
function serviceName(): string {
  return process.env.OTEL_SERVICE_NAME || "platform";
}

export function startTelemetry(extraProcessors: SpanProcessor[] = []): NodeSDK {
  const holder = globalThis as Holder;
  const existing = holder[SDK_KEY];
  if (existing) return existing;
  const spanProcessors: SpanProcessor[] = [...extraProcessors];
  if (process.env.OTEL_EXPORTER_OTLP_ENDPOINT) {
    spanProcessors.push(new BatchSpanProcessor({ exporter: new OTLPTraceExporter(), scheduledDelayMillis: 500 }));
  }
  // With nowhere to send spans, none are recorded: context still propagates (trace ids in logs
  // and headers) but no span is built only to be dropped on every request.
  const recording = spanProcessors.length > 0;
  const sdk = new NodeSDK({
    sampler: recording ? new ParentBasedSampler({ root: new AlwaysOnSampler() }) : new AlwaysOffSampler(),
    resource: resourceFromAttributes({
      [ATTR_SERVICE_NAME]: serviceName(),
      [ATTR_SERVICE_VERSION]: process.env.npm_package_version ?? "0.1.0",
    }),
    spanProcessors,
    // Traces only: without these the SDK sets up OTLP metric and log exporters by default and
    // spends seconds at every shutdown trying to flush them to a collector that may not exist.
    metricReaders: [],
    logRecordProcessors: [],
    instrumentations: [
      // Outgoing requests only. The HTTP servers that matter are Fastify's, whose instrumentation
      // below starts the server span from the request's traceparent; the rest answer probes. A
      // second, http-level span per request cost the gateway a third of its throughput.
      new HttpInstrumentation({ disableIncomingRequestInstrumentation: true }),
      new UndiciInstrumentation(),
      new PgInstrumentation({ requireParentSpan: true }),
      // One span per request, active while its handler runs; a span per lifecycle hook or per
      // handler would mostly measure the instrumentation itself.
      new fastifyOtel.FastifyOtelInstrumentation({
        registerOnInitialization: true,
        instrumentHooks: false,
        instrumentHandler: false,
        ignorePaths: (opts) => isProbe(opts.url),
      }),
    ],
  });
  sdk.start();
  holder[SDK_KEY] = sdk;
  return sdk;
}

/** Flushes spans; every process calls it on its way out. */
export async function shutdownTelemetry(): Promise<void> {
  const holder = globalThis as Holder;
  const sdk = holder[SDK_KEY];
  if (!sdk) return;
  delete holder[SDK_KEY];
  await sdk.shutdown().catch(() => undefined);
}
