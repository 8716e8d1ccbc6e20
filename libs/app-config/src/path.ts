/**
 * Config paths: one string syntax for every place that names a field of the config.
 *
 *   services.web.port          mapping keys joined with dots
 *   cron[0].schedule           a list element by index (problem paths: the document as written)
 *   cron[nightly].enabled      a list element by its `name` (config layers: overlay, source map)
 *   services["My.Svc"].run     a mapping key that is not identifier-like, JSON-quoted
 *
 * A key is written bare when it matches [A-Za-z_][A-Za-z0-9_-]*. A name segment `[x]` starts with
 * a letter, so it never reads as an index. Every list of the schema (storage.drives,
 * storage.buckets, cron) holds named entries with unique names.
 */

/** A mapping key (string), a list index (number), or a list element named by its `name` field. */
export type PathSegment = string | number | { name: string };

const BARE_KEY = /^[A-Za-z_][A-Za-z0-9_-]*$/;
const ELEMENT_NAME = /^[A-Za-z][A-Za-z0-9_-]*$/;

/** Whether `name` can be written as a `[name]` segment. */
export function isPathElementName(name: string): boolean {
  return ELEMENT_NAME.test(name);
}

export function formatConfigPath(segments: readonly PathSegment[]): string {
  let out = "";
  for (const segment of segments) {
    if (typeof segment === "number") {
      if (!Number.isInteger(segment) || segment < 0) throw new Error(`invalid path index ${segment}`);
      out += `[${segment}]`;
    } else if (typeof segment === "string") {
      if (BARE_KEY.test(segment)) out += out === "" ? segment : `.${segment}`;
      else out += `[${JSON.stringify(segment)}]`;
    } else {
      if (!ELEMENT_NAME.test(segment.name)) throw new Error(`invalid path element name ${JSON.stringify(segment.name)}`);
      out += `[${segment.name}]`;
    }
  }
  return out;
}

/** The segments of a path written by `formatConfigPath`, or null when it is not one. */
export function parseConfigPath(path: string): PathSegment[] | null {
  const segments: PathSegment[] = [];
  let i = 0;
  if (path === "") return null;
  while (i < path.length) {
    const ch = path[i];
    if (ch === "[") {
      if (path[i + 1] === '"') {
        // A JSON string up to the closing quote that is followed by `]`.
        let j = i + 2;
        while (j < path.length) {
          if (path[j] === "\\") j += 2;
          else if (path[j] === '"') break;
          else j += 1;
        }
        if (j >= path.length || path[j + 1] !== "]") return null;
        let key: unknown;
        try {
          key = JSON.parse(path.slice(i + 1, j + 1));
        } catch {
          return null;
        }
        if (typeof key !== "string") return null;
        segments.push(key);
        i = j + 2;
      } else {
        const close = path.indexOf("]", i);
        if (close < 0) return null;
        const inner = path.slice(i + 1, close);
        if (/^(0|[1-9][0-9]*)$/.test(inner)) {
          const index = Number(inner);
          if (!Number.isSafeInteger(index)) return null;
          segments.push(index);
        } else if (ELEMENT_NAME.test(inner)) segments.push({ name: inner });
        else return null;
        i = close + 1;
      }
    } else {
      if (segments.length > 0) {
        if (ch !== ".") return null;
        i += 1;
      }
      const match = /^[A-Za-z_][A-Za-z0-9_-]*/.exec(path.slice(i));
      if (!match) return null;
      segments.push(match[0]);
      i += match[0].length;
    }
  }
  return segments;
}
