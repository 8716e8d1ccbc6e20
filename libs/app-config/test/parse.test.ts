import { describe, it, expect } from "vitest";
import {
  checkConfigBounds,
  MAX_CONFIG_BYTES,
  parseAppConfigYaml,
  parseConfigYaml,
  type ConfigProblem,
} from "../src/index.ts";
import { ARCHITECTURE_EXAMPLE, containerConfig, expectOne, STATIC_EXAMPLE } from "./fixtures.ts";

function errorsOf(text: string): ConfigProblem[] {
  const result = parseAppConfigYaml(text);
  expect(result.ok).toBe(false);
  return result.ok ? [] : result.errors;
}

/** `depth` nested flow mappings: {a: {a: ... 1}} has depth `depth`. */
function nestedFlow(depth: number): string {
  return `${"{a: ".repeat(depth)}1${"}".repeat(depth)}\n`;
}

/** `depth` nested block mappings. */
function nestedBlock(depth: number): string {
  const lines = [];
  for (let i = 0; i < depth - 1; i += 1) lines.push(`${"  ".repeat(i)}a:`);
  lines.push(`${"  ".repeat(depth - 1)}a: 1`);
  return `${lines.join("\n")}\n`;
}

describe("parseAppConfigYaml: accepted documents", () => {
  it("parses the ARCHITECTURE example, comments and flow style included", () => {
    const result = parseAppConfigYaml(ARCHITECTURE_EXAMPLE);
    expect(result).toEqual({ ok: true, config: containerConfig() });
  });

  it("parses the static example", () => {
    const result = parseAppConfigYaml(STATIC_EXAMPLE);
    expect(result.ok).toBe(true);
    if (result.ok) expect(result.config.static).toEqual({ dir: "dist", spa_fallback: true, index_document: "index.html" });
  });

  it("accepts aliases within the bounds", () => {
    const text = `services:
  web: &svc
    run: node server.js
    port: 8080
  api:
    run: node api.js
    port: 8081
    memory_mb: &mem 512
  admin:
    run: node admin.js
    port: 8082
    memory_mb: *mem
`;
    const result = parseAppConfigYaml(text);
    expect(result.ok).toBe(true);
    if (result.ok) expect(result.config.services?.admin?.memory_mb).toBe(512);
  });

  it("accepts a document of exactly 64 KiB", () => {
    const head = "services:\n  web:\n    run: node s.js\n    port: 80\n";
    const text = head + "#".repeat(MAX_CONFIG_BYTES - head.length - 1) + "\n";
    expect(new TextEncoder().encode(text).byteLength).toBe(MAX_CONFIG_BYTES);
    expect(parseAppConfigYaml(text).ok).toBe(true);
  });

  it("accepts 16 levels of nesting (the bound) as YAML", () => {
    const result = parseConfigYaml(`x: ${nestedFlow(15)}`);
    expect(result.ok).toBe(true);
  });

  it("parses YAML 1.2 core scalars: yes is a string, 0x1F an integer", () => {
    const result = parseConfigYaml("a: yes\nb: 0x1F\nc: ~\n");
    expect(result.ok && result.value).toEqual({ a: "yes", b: 31, c: null });
  });
});

describe("parseAppConfigYaml: bounds", () => {
  it("refuses 64 KiB + 1 byte with too_large", () => {
    const head = "services:\n  web:\n    run: node s.js\n    port: 80\n";
    const text = head + "#".repeat(MAX_CONFIG_BYTES - head.length) + "\n";
    expect(text.length).toBe(MAX_CONFIG_BYTES + 1);
    expectOne(errorsOf(text), "too_large", null);
  });

  it("counts UTF-8 bytes, not characters", () => {
    const text = `# ${"é".repeat(MAX_CONFIG_BYTES / 2)}\n`;
    expect(text.length).toBeLessThan(MAX_CONFIG_BYTES);
    expectOne(errorsOf(text), "too_large", null);
  });

  it("refuses 17 levels of flow nesting with too_deep and its place", () => {
    const problem = expectOne(errorsOf(`x: ${nestedFlow(16)}`), "too_deep");
    expect(problem.line).toBe(1);
    expect(problem.column).toBeGreaterThan(1);
  });

  it("refuses 17 levels of block nesting with too_deep", () => {
    expect(parseConfigYaml(nestedBlock(16)).ok).toBe(true);
    const problem = expectOne(errorsOf(nestedBlock(17)), "too_deep");
    expect(problem.line).toBe(17);
  });

  it("refuses deep sequences", () => {
    expectOne(errorsOf(`x: ${"[".repeat(16)}1${"]".repeat(16)}\n`), "too_deep");
  });

  it("refuses pathological nesting without crashing (deeper than the parser's own stack)", () => {
    const text = `x: ${"[".repeat(30_000)}${"]".repeat(30_000)}`;
    expect(text.length).toBeLessThan(MAX_CONFIG_BYTES);
    expectOne(errorsOf(text), "too_deep");
  });

  it("refuses nesting built with aliases (depth counted after resolution)", () => {
    const text = `a: &a ${nestedFlow(10).trim()}\nb: {x: {x: {x: {x: {x: {x: {x: *a}}}}}}}\n`;
    const problem = expectOne(errorsOf(text), "too_deep");
    expect(problem.path).toMatch(/^b\.x\.x/);
    expect(problem.line).toBe(2);
  });

  it("refuses a billion laughs with too_many_nodes", () => {
    const text = `a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`;
    // Refused by the yaml library's maxAliasCount before anything is expanded.
    expect(expectOne(errorsOf(text), "too_many_nodes", null).message).toContain("aliases");
  });

  it("refuses alias expansion past 10 000 nodes that the library's alias guard lets through", () => {
    const big = `[${Array.from({ length: 3000 }, (_, i) => i).join(",")}]`;
    const text = `a: &a ${big}\nb: *a\nc: *a\nd: *a\n`;
    expect(text.length).toBeLessThan(MAX_CONFIG_BYTES);
    // Refused by the node count after resolution: 4 x 3000 values.
    expect(expectOne(errorsOf(text), "too_many_nodes", null).message).toContain("10000 values");
  });

  it("accepts the same document under 10 000 nodes", () => {
    const big = `[${Array.from({ length: 3000 }, (_, i) => i).join(",")}]`;
    expect(parseConfigYaml(`a: &a ${big}\nb: *a\nc: *a\n`).ok).toBe(true);
  });

  it("refuses a NUL character in a value or a key, with its place (the store cannot hold one)", () => {
    const value = expectOne(errorsOf('services:\n  web:\n    run: "a\\u0000b"\n'), "invalid_value");
    expect(value).toMatchObject({ path: "services.web.run", line: 3 });
    expect(value.message).toContain("NUL character");
    expect(expectOne(errorsOf('"a\\0b": 1\n'), "invalid_value").message).toContain("NUL character");
  });

  it("refuses a self-referencing alias (a cycle) with too_deep", () => {
    expect(expectOne(errorsOf("a: &a [*a]\n"), "too_deep").path).toBe(`a${"[0]".repeat(15)}`);
  });
});

describe("parseAppConfigYaml: YAML errors", () => {
  it("reports a syntax error with the parser's message, line and column", () => {
    const problem = expectOne(errorsOf("services:\n  web:\n    run: x\n   port: 1\n"), "yaml_syntax", null);
    expect(problem).toEqual({
      code: "yaml_syntax",
      message: "All mapping items must start at the same column at line 4, column 1",
      line: 4,
      column: 1,
    });
  });

  it("reports the column of a syntax error inside a line", () => {
    const problem = expectOne(errorsOf("services:\n  web:\n    run: x\n  port 1\n    x: 2\n"), "yaml_syntax");
    expect(problem.line).toBe(4);
    expect(problem.column).toBe(3);
    expect(problem.message).toContain("at line 4, column 3");
    expect(problem.message).not.toContain("\n");
  });

  it("reports an unclosed quote", () => {
    const problem = expectOne(errorsOf("type: 'static\n"), "yaml_syntax");
    expect(problem.message).toContain("quote");
    expect(problem.line).toBe(2);
  });

  it("reports an unclosed flow sequence", () => {
    const problem = errorsOf("a: 1\nb: [1, 2\nc: 3\n")[0] as ConfigProblem;
    expect(problem.code).toBe("yaml_syntax");
    expect(problem.line).toBe(3);
    expect(problem.column).toBe(1);
  });

  it("refuses duplicate keys", () => {
    const problem = expectOne(errorsOf("services: {}\nservices: {}\n"), "yaml_syntax");
    expect(problem.message).toContain("unique");
    expect(problem.line).toBe(2);
  });

  it("refuses tabs as indentation", () => {
    expect(errorsOf("a:\n\tb: 1\n")[0]?.code).toBe("yaml_syntax");
  });

  it("refuses several documents", () => {
    expect(errorsOf("a: 1\n---\nb: 2\n")[0]?.code).toBe("yaml_syntax");
    expect(errorsOf("a: 1\n---\nb: 2\n")[0]?.message).toBe("The config must be a single YAML document; this text holds several (separated by ---).");
  });

  it("refuses an alias used before its anchor", () => {
    const problem = expectOne(errorsOf("a: *x\nb: &x 1\n"), "yaml_syntax");
    expect(problem.message).toContain("*x");
    expect(problem.line).toBe(1);
  });

  it("refuses unknown tags with yaml_unsupported", () => {
    const problem = expectOne(errorsOf("type: !shell container\n"), "yaml_unsupported");
    expect(problem.line).toBe(1);
  });

  it("refuses collections as mapping keys", () => {
    expectOne(errorsOf("? [a, b]\n: c\n"), "yaml_unsupported");
  });

  it.each([
    ["", "empty"],
    ["# only a comment\n", "empty"],
    ["- a\n- b\n", "a list"],
    ["hello\n", "a single value"],
    ["42\n", "a single value"],
  ])("refuses a document that is not a mapping: %j", (text, what) => {
    expect(expectOne(errorsOf(text), "not_a_mapping", null).message).toContain(what);
  });
});

describe("parseAppConfigYaml: schema problems", () => {
  it("returns every schema problem with its path, line and column", () => {
    const text = `services:
  web:
    run: node s.js
    prot: 8080
  worker:
    run: node w.js
    background: true
    port: 9000
cron:
  - { name: nightly, schedule: "0 25 * * *", path: /n }
`;
    const problems = errorsOf(text);
    expect(problems).toEqual([
      expect.objectContaining({ code: "unknown_key", path: "services.web.prot", line: 4, column: 5 }),
      expect.objectContaining({ code: "required", path: "services.web.port", line: 2, column: 3 }),
      expect.objectContaining({ code: "not_allowed", path: "services.worker.port", line: 8, column: 5 }),
      expect.objectContaining({ code: "invalid_format", path: "cron[0].schedule", line: 10, column: 22 }),
    ]);
  });

  it("places a missing top-level section at the document start", () => {
    const problem = expectOne(errorsOf("type: container\n"), "required", "services");
    expect(problem.line).toBe(1);
  });

  it("refuses a key that is not a string after the yaml conversion as unknown", () => {
    expectOne(errorsOf("services: {web: {run: x, port: 1}}\n1: x\n"), "unknown_key", '["1"]');
  });

  it("parseConfigYaml returns the raw mapping without the schema, and a locator", () => {
    const result = parseConfigYaml("services:\n  web:\n    port: nope\n");
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.value).toEqual({ services: { web: { port: "nope" } } });
    expect(result.locate("services.web.port")).toEqual({ line: 3, column: 5 });
    expect(result.locate("services.web.run")).toEqual({ line: 2, column: 3 });
    expect(result.locate("nothing")).toEqual({ line: 1, column: 1 });
  });

  it("the locator follows list indices and element names", () => {
    const result = parseConfigYaml("cron:\n  - name: a\n    path: /a\n  - name: b\n    path: /b\n");
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.locate("cron[1]")).toEqual({ line: 4, column: 5 });
    expect(result.locate("cron[1].path")).toEqual({ line: 5, column: 5 });
    expect(result.locate("cron[b].path")).toEqual({ line: 5, column: 5 });
    expect(result.locate("cron[7].path")).toEqual({ line: 1, column: 1 });
  });
});

describe("checkConfigBounds (a config submitted as an object)", () => {
  it("accepts the example", () => {
    expect(checkConfigBounds(containerConfig())).toEqual([]);
  });

  it("accepts depth 16 and refuses depth 17 with the path of the first level too deep", () => {
    const build = (depth: number): unknown => (depth === 0 ? 1 : { a: build(depth - 1) });
    expect(checkConfigBounds(build(16))).toEqual([]);
    const problem = expectOne(checkConfigBounds(build(17)), "too_deep");
    expect(problem.path).toBe(Array(16).fill("a").join("."));
  });

  it("counts lists as levels too", () => {
    const build = (depth: number): unknown => (depth === 0 ? 1 : [build(depth - 1)]);
    expect(checkConfigBounds(build(16))).toEqual([]);
    expectOne(checkConfigBounds(build(17)), "too_deep");
  });

  it("refuses more than 10 000 values", () => {
    expect(checkConfigBounds({ a: Array(9_998).fill(0) })).toEqual([]);
    expectOne(checkConfigBounds({ a: Array(9_999).fill(0) }), "too_many_nodes");
  });

  it("refuses a cyclic value instead of looping", () => {
    const a: Record<string, unknown> = {};
    a.self = a;
    expectOne(checkConfigBounds(a), "too_deep");
  });

  it("refuses a shared subtree counted every time it is reachable", () => {
    const leaf = Array(100).fill(0);
    const mid = Array(10).fill(leaf);
    expectOne(checkConfigBounds({ a: mid, b: mid, c: mid, d: mid, e: mid, f: mid, g: mid, h: mid, i: mid, j: mid }), "too_many_nodes");
  });

  it("takes custom limits", () => {
    expectOne(checkConfigBounds({ a: { b: 1 } }, { maxDepth: 1 }), "too_deep", "a");
    expectOne(checkConfigBounds([1, 2, 3], { maxNodes: 3 }), "too_many_nodes");
  });
});
