/**
 * Input no route may take, refused before any service sees it: a NUL character anywhere (no text
 * the platform stores may hold one: Postgres text cannot), half of a surrogate pair (not text at
 * all), a body nested past what can travel to a service as a protobuf value, a number JSON parses
 * to infinity (no protobuf value holds one), a body field its route does not declare, a body value
 * of another type than its field's, and a number in the URL not written plainly.
 */
import { AjvCompiler, type ValidatorFactory } from "@fastify/ajv-compiler";
import type { FastifySchemaCompiler, RouteOptions } from "fastify";
import { PlatformError } from "@platform/errors";

const NUL_MESSAGE = "Input may not contain a NUL character (\\u0000).";

/** A NUL in the URL makes it malformed (400); one in a JSON string is a value refused (422). */
function nulRefused(): PlatformError {
  return PlatformError.badRequest(NUL_MESSAGE);
}

/**
 * How deep a request body may nest. Configs are bounded far lower by their own rules (too_deep);
 * a body past this could not even travel to a service as a protobuf value.
 */
const MAX_BODY_DEPTH = 32;

function tooDeep(): PlatformError {
  const message = `The request body nests deeper than ${MAX_BODY_DEPTH} levels.`;
  // Listed in `errors` too, as the config save lists each of its refusals.
  return PlatformError.invalid({ code: "too_deep", message, errors: [{ code: "too_deep", message }] });
}

/** The deepest nesting of objects and arrays in JSON text (brackets inside strings do not count). */
function nestingDepth(json: string): number {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) max = Math.max(max, ++depth);
    else if (c === 0x7d || c === 0x5d) depth--;
  }
  return max;
}

/** Whether a string of the value, a key included, is one `bad` finds. */
function holdsString(value: unknown, bad: (text: string) => boolean): boolean {
  if (typeof value === "string") return bad(value);
  if (Array.isArray(value)) return value.some((v) => holdsString(v, bad));
  if (value && typeof value === "object") return Object.entries(value).some(([k, v]) => bad(k) || holdsString(v, bad));
  return false;
}

/** The refusal of a request URL (path and query, still percent-encoded), or null. */
export function refuseUrl(url: string): PlatformError | null {
  return /%00/i.test(url) ? nulRefused() : null;
}

function holdsInfinity(value: unknown): boolean {
  if (typeof value === "number") return !Number.isFinite(value);
  if (Array.isArray(value)) return value.some(holdsInfinity);
  if (value && typeof value === "object") return Object.values(value).some(holdsInfinity);
  return false;
}

const LONE_SURROGATE_ESCAPE = /\\u[dD][89a-fA-F]/;

/** A number literal that may overflow a double: an exponent of three digits or more, or 309 digits. */
const HUGE_NUMBER = /[eE][+-]?\d{3}|\d{309}/;

/**
 * Why JSON the parser refused is refused, when it is valid JSON after all: it holds `__proto__`
 * or `constructor.prototype` keys, which the gateway's parser never accepts (prototype
 * poisoning). Null for text that is not JSON: that is the parser's own 400.
 */
export function refuseUnparsed(text: string): PlatformError | null {
  try {
    JSON.parse(text);
  } catch {
    return null;
  }
  return PlatformError.invalid({ code: "forbidden_key", message: "A body may not hold the keys __proto__ or constructor.prototype." });
}

/** The refusal of a parsed JSON body, given its text, or null. */
export function refuseBody(text: string, value: unknown): PlatformError | null {
  if (nestingDepth(text) > MAX_BODY_DEPTH) return tooDeep();
  // The escape is rare; only a body that has it is searched for a NUL that is really in a string.
  if (text.includes("\\u0000") && holdsString(value, (t) => t.includes("\0"))) return PlatformError.invalid({ code: "nul_character", message: NUL_MESSAGE });
  // Only a JSON escape can make half of a surrogate pair (UTF-8 text cannot hold one); stored as
  // UTF-8 it would silently turn into U+FFFD.
  if (LONE_SURROGATE_ESCAPE.test(text) && holdsString(value, (t) => !t.isWellFormed())) {
    return PlatformError.invalid({ code: "lone_surrogate", message: "Input may not contain half of a UTF-16 surrogate pair (such as \\ud800 alone): it is not text." });
  }
  if (HUGE_NUMBER.test(text) && holdsInfinity(value)) {
    return PlatformError.invalid({ code: "number_out_of_range", message: "A number in the body is too large to represent (at most about 1.8e308)." });
  }
  return null;
}

/**
 * Every route's JSON object body is closed: a field the route does not declare is refused with a
 * 422 naming it, never ignored, so a client that misspells `branch` learns it instead of building
 * the production branch. A route that must judge unknown fields itself says so with its own
 * `additionalProperties`.
 */
export function closeBody(route: RouteOptions): void {
  const body = route.schema?.body as ObjectSchema | undefined;
  if (!body || body.additionalProperties !== undefined) return;
  const types = Array.isArray(body.type) ? body.type : [body.type];
  if (!types.includes("object")) return;
  body.additionalProperties = false;
  closeFields(body);
}

interface ObjectSchema {
  type?: unknown;
  properties?: Record<string, ObjectSchema>;
  additionalProperties?: unknown;
}

/**
 * A field that is an object of named fields (`clone_components: {db, drives, buckets}`) is closed
 * too; one that holds what the client chooses (`deploy_config`) says so with its own
 * `additionalProperties`, or names no fields at all.
 */
function closeFields(schema: ObjectSchema): void {
  for (const field of Object.values(schema.properties ?? {})) {
    if (!field.properties) continue;
    field.additionalProperties ??= false;
    closeFields(field);
  }
}

/** Whole numbers as a person writes them in a URL: digits, with an optional sign. */
const INTEGER_TEXT = /^[+-]?\d+$/;
/** Decimal numbers as a person writes them in a URL (no hex, no exponent, no blanks). */
const NUMBER_TEXT = /^[+-]?(?:\d+\.?\d*|\.\d+)$/;

/** The properties of a query or params schema that are numbers, with the text each must match. */
function numericProperties(schema: unknown): Array<[string, RegExp]> {
  const properties = (schema as { properties?: Record<string, { type?: unknown }> } | undefined)?.properties ?? {};
  const out: Array<[string, RegExp]> = [];
  for (const [name, property] of Object.entries(properties)) {
    const types = Array.isArray(property.type) ? property.type : [property.type];
    if (types.includes("string")) continue;
    if (types.includes("integer")) out.push([name, INTEGER_TEXT]);
    else if (types.includes("number")) out.push([name, NUMBER_TEXT]);
  }
  return out;
}

type Validate = ((data: unknown, context?: unknown) => unknown) & { errors?: unknown; schemaEnv?: unknown };

/**
 * ajv reads a number out of text as JavaScript does, so `?limit=0x10` would be 16, `1e2` 100 and
 * `%205` 5: a client's typo taken for another value. Numbers in a URL are refused unless written
 * plainly, with the error ajv gives for a value of the wrong type.
 */
function plainNumbers(validate: Validate, schema: unknown): Validate {
  const numeric = numericProperties(schema);
  if (numeric.length === 0) return validate;
  const checked: Validate = (data, context) => {
    const values = (data ?? {}) as Record<string, unknown>;
    for (const [name, text] of numeric) {
      const value = values[name];
      if (typeof value === "string" && !text.test(value)) {
        const type = text === INTEGER_TEXT ? "integer" : "number";
        return { error: [{ keyword: "type", instancePath: `/${name}`, schemaPath: `#/properties/${name}/type`, params: { type }, message: `must be ${type}` }] };
      }
    }
    const ok = validate(data, context);
    checked.errors = validate.errors;
    return ok;
  };
  // Fastify hands ajv's own functions the request, so that a coerced value is written back.
  checked.schemaEnv = validate.schemaEnv;
  return checked;
}

/**
 * The schema compiler of every route. A query string or path parameter is text, so it is coerced
 * to its schema's type (`?limit=5` is the number 5) when it is written plainly; a JSON body
 * arrives typed, and is taken as sent: coercing it would read `"false"` as false, `"2"` as 2 and
 * `"A"` as `["A"]`.
 */
export function typedBodyValidator(): ValidatorFactory {
  // The pool's typings name ajv's own compile function; Fastify calls it with a route's schema.
  const pool = AjvCompiler() as unknown as (externalSchemas: unknown, options: AjvPoolOptions) => FastifySchemaCompiler<unknown>;
  const factory = (externalSchemas: unknown, options: AjvPoolOptions = {}): FastifySchemaCompiler<unknown> => {
    const coercing = pool(externalSchemas, options);
    const asSent = pool(externalSchemas, { ...options, customOptions: { ...options.customOptions, coerceTypes: false } });
    return (route) => {
      if (route.httpPart === "body") return asSent(route);
      return plainNumbers(coercing(route) as Validate, route.schema) as ReturnType<FastifySchemaCompiler<unknown>>;
    };
  };
  return factory as unknown as ValidatorFactory;
}

type AjvPoolOptions = { customOptions?: Record<string, unknown>; plugins?: unknown[] };
