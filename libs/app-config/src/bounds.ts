/**
 * Size bounds on a config value, checked before the schema: nesting depth and node count, and no
 * NUL character anywhere. Used on a parsed YAML document (after alias resolution, so an alias
 * counts every time it is used) and on a config submitted as a JSON object.
 */
import { Document } from "yaml";
import { formatConfigPath, type PathSegment } from "./path.ts";
import { MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_NODES, type ConfigProblem } from "./types.ts";

/**
 * Depth counts collections: the root mapping is depth 1, `storage.drives[0]` is depth 4. Nodes
 * count every value (the root, every mapping value, every list item), keys excluded. Returns at
 * most one problem (`too_deep` with the path of the first collection past the bound,
 * `too_many_nodes`, or `invalid_value` for a key or string holding U+0000); the walk stops there,
 * so a cyclic or alias-bombed value is cheap to refuse.
 */
export function checkConfigBounds(
  value: unknown,
  limits: { maxDepth?: number; maxNodes?: number } = {},
): ConfigProblem[] {
  const maxDepth = limits.maxDepth ?? MAX_CONFIG_DEPTH;
  const maxNodes = limits.maxNodes ?? MAX_CONFIG_NODES;
  let nodes = 0;
  const path: PathSegment[] = [];

  // Postgres text and jsonb cannot hold U+0000, and no command or name needs one.
  const nulCharacter = (): ConfigProblem => ({
    code: "invalid_value",
    message: `${path.length > 0 ? formatConfigPath(path) : "The config"} holds a NUL character (\\u0000), which a config may not contain.`,
    ...(path.length > 0 ? { path: formatConfigPath(path) } : {}),
  });

  const visit = (v: unknown, depth: number): ConfigProblem | null => {
    nodes += 1;
    if (nodes > maxNodes) {
      return {
        code: "too_many_nodes",
        message: `The config has more than ${maxNodes} values once aliases are expanded.`,
      };
    }
    if (typeof v === "string" && v.includes("\0")) return nulCharacter();
    if (typeof v !== "object" || v === null) return null;
    const level = depth + 1;
    if (level > maxDepth) {
      return {
        code: "too_deep",
        message: `The config nests deeper than ${maxDepth} levels.`,
        ...(path.length > 0 ? { path: formatConfigPath(path) } : {}),
      };
    }
    if (Array.isArray(v)) {
      for (let index = 0; index < v.length; index += 1) {
        path.push(index);
        const problem = visit(v[index], level);
        path.pop();
        if (problem) return problem;
      }
    } else {
      for (const key of Object.keys(v)) {
        path.push(key);
        if (key.includes("\0")) return nulCharacter();
        const problem = visit((v as Record<string, unknown>)[key], level);
        path.pop();
        if (problem) return problem;
      }
    }
    return null;
  };

  const problem = visit(value, 0);
  return problem ? [problem] : [];
}

/**
 * The size bound on a config submitted as a JSON object: at most MAX_CONFIG_BYTES written as YAML,
 * the bound its YAML form has, so that a config saved in one form can be saved back in the other
 * (effective_yaml). Call after checkConfigBounds: the node bound keeps the rendering small.
 */
export function checkConfigSize(value: unknown): ConfigProblem[] {
  const size = utf8Length(new Document(value).toString({ lineWidth: 0 }));
  if (size <= MAX_CONFIG_BYTES) return [];
  return [{ code: "too_large", message: `The config is larger than ${MAX_CONFIG_BYTES} bytes (64 KiB) written as YAML (${size} bytes).` }];
}

/** A text's size in bytes, as UTF-8: what MAX_CONFIG_BYTES bounds. */
export function utf8Length(text: string): number {
  return new TextEncoder().encode(text).byteLength;
}
