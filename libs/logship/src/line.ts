/**
 * The log line contract (spec doc 1 section 2.6, as shipped): what an agent publishes on
 * `logs.<app>.<source>` and what health-aggregator stores. One NATS message carries a batch: a
 * JSON array of lines (a single line object is accepted too).
 *
 * `validateLogLine` is the one validator of both ends. It normalises rather than refuses where a
 * line is still useful: absent or empty nullable fields become null, `ts` is rewritten as ISO
 * 8601 UTC, an over-long message is cut, oversized metadata is replaced by a marker, and text
 * Postgres cannot store (NUL, lone surrogates) is replaced. It refuses only what cannot be a log
 * line: no message, an unknown source or level, an unparseable timestamp, a malformed id.
 */
import { pairSafeEnd } from "@platform/bus";

export const LOG_SOURCES = ["agent", "deploy", "build", "container", "backup"] as const;
export type LogSource = (typeof LOG_SOURCES)[number];

export const LOG_LEVELS = ["info", "warning", "error"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** A line as published. Nullable fields may be absent. */
export interface LogLine {
  /**
   * The line's identity (a UUID), assigned by `LogShipper`. health-aggregator stores a line id
   * once, so a batch published twice or delivered again is stored once. Lines published without
   * one get an id derived from their place in the stream (stream, sequence, index).
   */
  id?: string;
  /** ISO 8601. */
  ts: string;
  source: LogSource;
  level: LogLevel;
  app_name?: string | null;
  branch?: string | null;
  /** The group owning the app: who may read the line. Null: operators only. */
  group_slug?: string | null;
  service_name?: string | null;
  deployment_id?: string | null;
  build_id?: string | null;
  action_id?: string | null;
  /** The host that shipped the line. */
  instance_id?: string | null;
  message: string;
  metadata?: Record<string, unknown>;
}

/** A line after validation: every field present, nullable ones as null. */
export interface ValidLogLine {
  id: string | null;
  ts: string;
  source: LogSource;
  level: LogLevel;
  app_name: string | null;
  branch: string | null;
  group_slug: string | null;
  service_name: string | null;
  deployment_id: string | null;
  build_id: string | null;
  action_id: string | null;
  instance_id: string | null;
  message: string;
  metadata: Record<string, unknown>;
}

export type LogLineResult = { ok: true; line: ValidLogLine } | { ok: false; error: string };

/** Characters of `message` kept; the rest is cut and marked. */
export const MAX_MESSAGE_CHARS = 16_384;
/** Serialized size of `metadata` kept; larger metadata is replaced by `{truncated: true, bytes}`. */
export const MAX_METADATA_CHARS = 8_192;
/** Length of the name fields (app, branch, group, service, instance). */
export const MAX_NAME_CHARS = 256;
/** Length of a deployment, build or action id. */
export const MAX_ID_CHARS = 64;

export const TRUNCATION_MARK = " … [truncated]";

const HEX_OR_HYPHEN = /^[0-9a-fA-F-]+$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const NAME_FIELDS = ["app_name", "branch", "group_slug", "service_name", "instance_id"] as const;
const ID_FIELDS = ["deployment_id", "build_id", "action_id"] as const;
// Postgres has no timestamps before 4713 BC or after 294276 AD; ISO 8601 with a four-digit year is the sane range.
const MIN_TS = Date.UTC(1970, 0, 1);
const MAX_TS = Date.UTC(9999, 11, 31);

/** Deployment, build and action ids are hex digits and hyphens only (spec doc 1 section 4.6). */
export function isHexOrHyphenId(value: string): boolean {
  return value.length > 0 && value.length <= MAX_ID_CHARS && HEX_OR_HYPHEN.test(value);
}

/** Text Postgres stores as is: no NUL, no lone surrogate. */
export function storableText(value: string): string {
  const text = value.includes("\u0000") ? value.replaceAll("\u0000", "\uFFFD") : value;
  return text.isWellFormed() ? text : text.toWellFormed();
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A JSON-safe copy of `value` with storable strings (keys too); undefined where JSON has no value. */
function storableJson(value: unknown, depth: number): unknown {
  if (typeof value === "string") return storableText(value);
  if (typeof value === "number") return Number.isFinite(value) ? value : null;
  if (typeof value === "boolean" || value === null) return value;
  if (typeof value === "bigint") return value.toString();
  if (depth > 16) return null;
  if (Array.isArray(value)) return value.map((v) => storableJson(v, depth + 1) ?? null);
  if (isPlainObject(value)) {
    if (typeof (value as { toJSON?: unknown }).toJSON === "function") return storableJson((value as { toJSON(): unknown }).toJSON(), depth + 1);
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      const clean = storableJson(v, depth + 1);
      if (clean !== undefined) out[storableText(k)] = clean;
    }
    return out;
  }
  return undefined;
}

/** A message as a log line keeps it: at most MAX_MESSAGE_CHARS, the rest cut and marked. */
export function cutMessage(message: string): string {
  if (message.length <= MAX_MESSAGE_CHARS) return message;
  return `${message.slice(0, pairSafeEnd(message, MAX_MESSAGE_CHARS - TRUNCATION_MARK.length))}${TRUNCATION_MARK}`;
}

function normaliseTs(value: unknown): string | null {
  if (value instanceof Date) value = value.toISOString();
  if (typeof value !== "string" || value.length === 0 || value.length > 64) return null;
  const ms = Date.parse(value);
  if (!Number.isFinite(ms) || ms < MIN_TS || ms > MAX_TS) return null;
  return new Date(ms).toISOString();
}

/** Validates and normalises one line (see the module comment). */
export function validateLogLine(input: unknown): LogLineResult {
  if (!isPlainObject(input)) return { ok: false, error: "a log line must be a JSON object" };
  const fail = (error: string): LogLineResult => ({ ok: false, error });

  let id: string | null = null;
  if (input.id !== undefined && input.id !== null && input.id !== "") {
    if (typeof input.id !== "string" || !UUID.test(input.id)) return fail("id must be a UUID");
    id = input.id.toLowerCase();
  }
  const ts = normaliseTs(input.ts);
  if (ts === null) return fail("ts must be an ISO 8601 timestamp between 1970 and 9999");
  if (typeof input.source !== "string" || !(LOG_SOURCES as readonly string[]).includes(input.source)) {
    return fail(`source must be one of ${LOG_SOURCES.join(", ")}`);
  }
  if (typeof input.level !== "string" || !(LOG_LEVELS as readonly string[]).includes(input.level)) {
    return fail(`level must be one of ${LOG_LEVELS.join(", ")}`);
  }
  if (typeof input.message !== "string") return fail("message must be a string");

  const names: Partial<Record<(typeof NAME_FIELDS)[number], string | null>> = {};
  for (const field of NAME_FIELDS) {
    const value = input[field];
    if (value === undefined || value === null || value === "") {
      names[field] = null;
      continue;
    }
    if (typeof value !== "string") return fail(`${field} must be a string or null`);
    if (value.length > MAX_NAME_CHARS) return fail(`${field} must be at most ${MAX_NAME_CHARS} characters`);
    names[field] = storableText(value);
  }
  const ids: Partial<Record<(typeof ID_FIELDS)[number], string | null>> = {};
  for (const field of ID_FIELDS) {
    const value = input[field];
    if (value === undefined || value === null || value === "") {
      ids[field] = null;
      continue;
    }
    if (typeof value !== "string" || !isHexOrHyphenId(value)) return fail(`${field} must be hex digits and hyphens (at most ${MAX_ID_CHARS})`);
    ids[field] = value.toLowerCase();
  }

  let metadata: Record<string, unknown> = {};
  if (input.metadata !== undefined && input.metadata !== null) {
    if (!isPlainObject(input.metadata)) return fail("metadata must be an object");
    metadata = storableJson(input.metadata, 0) as Record<string, unknown>;
    const size = JSON.stringify(metadata).length;
    if (size > MAX_METADATA_CHARS) metadata = { truncated: true, bytes: size };
  }

  return {
    ok: true,
    line: {
      id,
      ts,
      source: input.source as LogSource,
      level: input.level as LogLevel,
      app_name: names.app_name ?? null,
      branch: names.branch ?? null,
      group_slug: names.group_slug ?? null,
      service_name: names.service_name ?? null,
      deployment_id: ids.deployment_id ?? null,
      build_id: ids.build_id ?? null,
      action_id: ids.action_id ?? null,
      instance_id: names.instance_id ?? null,
      message: storableText(cutMessage(input.message)),
      metadata,
    },
  };
}

export interface DecodedBatch {
  lines: ValidLogLine[];
  /** Lines refused, by their index in the message. */
  rejected: Array<{ index: number; error: string }>;
}

/**
 * Reads one NATS message of the LOGS stream: a JSON array of lines or one line object. Throws
 * when the payload is not JSON at all or neither shape (the message can never be stored).
 */
export function decodeLogBatch(payload: string | Uint8Array): DecodedBatch {
  const text = typeof payload === "string" ? payload : new TextDecoder().decode(payload);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new Error("log message is not JSON");
  }
  const items = Array.isArray(parsed) ? parsed : isPlainObject(parsed) ? [parsed] : null;
  if (items === null) throw new Error("log message must be a JSON array of lines or one line object");
  const out: DecodedBatch = { lines: [], rejected: [] };
  items.forEach((item, index) => {
    const result = validateLogLine(item);
    if (result.ok) out.lines.push(result.line);
    else out.rejected.push({ index, error: result.error });
  });
  return out;
}
