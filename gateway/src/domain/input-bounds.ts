/**
 * Input no route may take, refused before any service sees it: a NUL character anywhere (no text
 * the platform stores may hold one: Postgres text cannot), and a body nested past what can travel
 * to a service as a protobuf value.
 */
import { PlatformError } from "@platform/errors";

function nulRefused(): PlatformError {
  return PlatformError.badRequest("Input may not contain a NUL character (\\u0000).");
}

/**
 * How deep a request body may nest. Configs are bounded far lower by their own rules (too_deep);
 * a body past this could not even travel to a service as a protobuf value.
 */
const MAX_BODY_DEPTH = 32;

function tooDeep(): PlatformError {
  return PlatformError.invalid({ code: "too_deep", message: `The request body nests deeper than ${MAX_BODY_DEPTH} levels.` });
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

function holdsNul(value: unknown): boolean {
  if (typeof value === "string") return value.includes("\0");
  if (Array.isArray(value)) return value.some(holdsNul);
  if (value && typeof value === "object") return Object.entries(value).some(([k, v]) => k.includes("\0") || holdsNul(v));
  return false;
}

/** The refusal of a request URL (path and query, still percent-encoded), or null. */
export function refuseUrl(url: string): PlatformError | null {
  return /%00/i.test(url) ? nulRefused() : null;
}

/** The refusal of a parsed JSON body, given its text, or null. */
export function refuseBody(text: string, value: unknown): PlatformError | null {
  if (nestingDepth(text) > MAX_BODY_DEPTH) return tooDeep();
  // The escape is rare; only a body that has it is searched for a NUL that is really in a string.
  if (text.includes("\\u0000") && holdsNul(value)) return nulRefused();
  return null;
}
