/**
 * platform.yaml text to a value, bounds first: at most 64 KiB (UTF-8), nesting at most 16 levels,
 * alias expansion bounded twice (the yaml library's `maxAliasCount`, then at most 10 000 values
 * counted after alias resolution). YAML 1.2 core schema; duplicate keys, several documents,
 * collections as keys and unknown tags are refused.
 */
import { isAlias, isMap, isScalar, isSeq, LineCounter, parseDocument, type Document, type Node } from "yaml";
import { checkConfigBounds, utf8Length } from "./bounds.ts";
import { parseConfigPath } from "./path.ts";
import { validateAppConfig, isMapping } from "./validate.ts";
import {
  MAX_ALIAS_COUNT,
  MAX_CONFIG_BYTES,
  MAX_CONFIG_DEPTH,
  type AppConfig,
  type ConfigProblem,
  type ConfigProblemCode,
} from "./types.ts";

/** 1-based line and column of a place in the YAML text. */
export interface TextPosition {
  line: number;
  column: number;
}

export type YamlValueResult =
  | {
      ok: true;
      value: Record<string, unknown>;
      /** Where a config path (`services.web.port`, `cron[0].name`) is written, or its nearest written ancestor. */
      locate: (path: string) => TextPosition | undefined;
    }
  | { ok: false; errors: ConfigProblem[] };

export type AppConfigParseResult = { ok: true; config: AppConfig } | { ok: false; errors: ConfigProblem[] };

/** The parser's message without its pretty-printed excerpt: "Map keys must be unique at line 2, column 1". */
function firstLine(message: string): string {
  return (message.split("\n")[0] ?? message).replace(/:\s*$/, "");
}

function problem(code: ConfigProblemCode, message: string, at?: TextPosition): ConfigProblem {
  return at ? { code, message, line: at.line, column: at.column } : { code, message };
}

/** Depth, keys and aliases checked on the syntax tree, before any alias is expanded. */
function checkTree(doc: Document, position: (node: Node | null | undefined) => TextPosition | undefined): ConfigProblem | null {
  const anchors = new Set<string>();
  const walk = (node: unknown, depth: number): ConfigProblem | null => {
    if (isAlias(node)) {
      if (anchors.has(node.source)) return null;
      return problem("yaml_syntax", `Unresolved alias *${node.source}: the anchor must be set before the alias`, position(node));
    }
    if (isScalar(node)) {
      if (node.anchor) anchors.add(node.anchor);
      return null;
    }
    if (!isMap(node) && !isSeq(node)) return null;
    if (node.anchor) anchors.add(node.anchor);
    const level = depth + 1;
    if (level > MAX_CONFIG_DEPTH) {
      return problem("too_deep", `The config nests deeper than ${MAX_CONFIG_DEPTH} levels.`, position(node));
    }
    if (isMap(node)) {
      for (const pair of node.items) {
        if (pair.key !== null && pair.key !== undefined && !isScalar(pair.key)) {
          return problem("yaml_unsupported", "A mapping key must be a plain value, not a collection or an alias.", position(pair.key as Node));
        }
        if (isScalar(pair.key) && pair.key.anchor) anchors.add(pair.key.anchor);
        const found = walk(pair.value, level);
        if (found) return found;
      }
    } else {
      for (const item of node.items) {
        const found = walk(item, level);
        if (found) return found;
      }
    }
    return null;
  };
  return walk(doc.contents, 0);
}

function locator(doc: Document, position: (node: Node | null | undefined) => TextPosition | undefined) {
  return (path: string): TextPosition | undefined => {
    const segments = parseConfigPath(path) ?? [];
    let node: unknown = doc.contents;
    let at = position(doc.contents);
    for (const segment of segments) {
      if (typeof segment === "string") {
        if (!isMap(node)) break;
        const pair = node.items.find((p) => isScalar(p.key) && String(p.key.value) === segment);
        if (!pair) break;
        at = position(pair.key as Node) ?? at;
        node = pair.value;
      } else if (typeof segment === "number") {
        if (!isSeq(node)) break;
        const item = node.items[segment];
        if (item === undefined) break;
        at = position(item as Node) ?? at;
        node = item;
      } else {
        if (!isSeq(node)) break;
        const item = node.items.find((i) => isMap(i) && i.items.some((p) => isScalar(p.key) && p.key.value === "name" && isScalar(p.value) && p.value.value === segment.name));
        if (item === undefined) break;
        at = position(item as Node) ?? at;
        node = item;
      }
    }
    return at;
  };
}

/**
 * YAML text to a plain mapping, bounded, without the schema (save-config validates the merged
 * config itself). Refusals: `too_large`, `yaml_syntax` (each parser error, message with line and
 * column), `yaml_unsupported`, `not_a_mapping`, `too_deep`, `too_many_nodes`.
 */
export function parseConfigYaml(text: string): YamlValueResult {
  if (typeof text !== "string") {
    return { ok: false, errors: [problem("wrong_type", "The config YAML must be a string.")] };
  }
  if (text.length > MAX_CONFIG_BYTES || utf8Length(text) > MAX_CONFIG_BYTES) {
    return { ok: false, errors: [problem("too_large", `The config is larger than ${MAX_CONFIG_BYTES} bytes (64 KiB).`)] };
  }

  const lineCounter = new LineCounter();
  const position = (node: Node | null | undefined): TextPosition | undefined => {
    const offset = node?.range?.[0];
    if (offset === undefined) return undefined;
    const { line, col } = lineCounter.linePos(offset);
    return { line, column: col };
  };

  let doc: Document;
  try {
    doc = parseDocument(text, { lineCounter, prettyErrors: true, uniqueKeys: true });
  } catch (err) {
    if (err instanceof RangeError) {
      return { ok: false, errors: [problem("too_deep", `The config nests deeper than ${MAX_CONFIG_DEPTH} levels.`)] };
    }
    throw err;
  }

  const fromParser = (
    code: ConfigProblemCode,
    e: { code: string; message: string; linePos?: [{ line: number; col: number }] | [{ line: number; col: number }, { line: number; col: number }] },
  ) =>
    problem(
      code,
      // The parser's own words for this one name its API (parseAllDocuments), not the config's rule.
      e.code === "MULTIPLE_DOCS" ? "The config must be a single YAML document; this text holds several (separated by ---)." : firstLine(e.message),
      e.linePos ? { line: e.linePos[0].line, column: e.linePos[0].col } : undefined,
    );

  const exhausted = doc.errors.find((e) => e.code === "RESOURCE_EXHAUSTION");
  if (exhausted) {
    const at = exhausted.linePos ? { line: exhausted.linePos[0].line, column: exhausted.linePos[0].col } : undefined;
    return { ok: false, errors: [problem("too_deep", `The config nests deeper than ${MAX_CONFIG_DEPTH} levels.`, at)] };
  }
  const errors = [
    ...doc.errors.map((e) => fromParser("yaml_syntax", e)),
    ...doc.warnings.map((e) => fromParser("yaml_unsupported", e)),
  ];
  if (errors.length > 0) return { ok: false, errors };

  if (!isMap(doc.contents)) {
    const what = doc.contents === null ? "empty" : isSeq(doc.contents) ? "a list" : "a single value";
    return {
      ok: false,
      errors: [problem("not_a_mapping", `The config must be a mapping of keys to values; this document is ${what}.`, position(doc.contents))],
    };
  }

  const treeProblem = checkTree(doc, position);
  if (treeProblem) return { ok: false, errors: [treeProblem] };

  let value: unknown;
  try {
    value = doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT });
  } catch (err) {
    if (err instanceof ReferenceError && /alias count/i.test(err.message)) {
      return { ok: false, errors: [problem("too_many_nodes", "The config expands too many aliases (a resource exhaustion guard).")] };
    }
    if (err instanceof ReferenceError) return { ok: false, errors: [problem("yaml_syntax", err.message)] };
    if (err instanceof RangeError) return { ok: false, errors: [problem("too_deep", `The config nests deeper than ${MAX_CONFIG_DEPTH} levels.`)] };
    throw err;
  }

  const locate = locator(doc, position);
  const bounds = checkConfigBounds(value);
  if (bounds.length > 0) return { ok: false, errors: withPositions(bounds, locate) };
  if (!isMapping(value)) {
    return { ok: false, errors: [problem("not_a_mapping", "The config must be a mapping of keys to values.")] };
  }
  return { ok: true, value, locate };
}

/** Problems with `line` and `column` added where `locate` knows their path. */
export function withPositions(problems: ConfigProblem[], locate: (path: string) => TextPosition | undefined): ConfigProblem[] {
  return problems.map((p) => {
    if (p.path === undefined || p.line !== undefined) return p;
    const at = locate(p.path);
    return at ? { ...p, line: at.line, column: at.column } : p;
  });
}

/** platform.yaml text to a validated `AppConfig`, or every problem (schema problems carry their line and column). */
export function parseAppConfigYaml(text: string): AppConfigParseResult {
  const parsed = parseConfigYaml(text);
  if (!parsed.ok) return parsed;
  const problems = validateAppConfig(parsed.value);
  if (problems.length > 0) return { ok: false, errors: withPositions(problems, parsed.locate) };
  return { ok: true, config: parsed.value as AppConfig };
}
