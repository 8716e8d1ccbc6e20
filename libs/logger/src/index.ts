/**
 * pino JSON logs with `service.name` and the active trace and span ids on every line; pretty
 * printed when writing to a terminal.
 */
import { pino, type Logger, type LoggerOptions } from "pino";
import { trace, isSpanContextValid } from "@opentelemetry/api";

export type { Logger };

export interface LoggerSettings {
  service: string;
  level?: string;
  /** Force pretty or JSON output; defaults to pretty on a TTY. */
  pretty?: boolean;
}

export function traceFields(): Record<string, string> {
  const ctx = trace.getActiveSpan()?.spanContext();
  if (!ctx || !isSpanContextValid(ctx)) return {};
  return { trace_id: ctx.traceId, span_id: ctx.spanId, trace_flags: `0${ctx.traceFlags.toString(16)}` };
}

export function createLogger(settings: LoggerSettings): Logger {
  const pretty = settings.pretty ?? Boolean(process.stdout.isTTY);
  const options: LoggerOptions = {
    level: settings.level ?? "info",
    base: { "service.name": settings.service, pid: process.pid },
    formatters: { level: (label) => ({ level: label }) },
    mixin: traceFields,
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  if (pretty) {
    return pino({
      ...options,
      transport: { target: "pino-pretty", options: { colorize: true, ignore: "pid,hostname,service.name", messageFormat: `[${settings.service}] {msg}` } },
    });
  }
  return pino(options);
}
