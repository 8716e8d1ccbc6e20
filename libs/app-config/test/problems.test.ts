import { describe, expect, it } from "vitest";
import { parseAppConfigYaml, problemsSummary } from "../src/index.ts";

describe("problemsSummary", () => {
  it("names every problem in the file's order, up to five, and counts the rest", () => {
    const services = Array.from({ length: 7 }, (_, i) => `  s${i}:\n    run: node x.js\n    port: 8080\n    replicas: 9\n`).join("");
    const parsed = parseAppConfigYaml(`type: container\nservices:\n${services}`);
    if (parsed.ok) throw new Error("expected problems");
    const summary = problemsSummary(parsed.errors);
    expect(summary).toMatch(/^7 problems: line 6, column 5: services\.s0\.replicas must be from 1 to 3, not 9; line 10, .*; and 2 more\.$/);
    expect(summary.match(/line \d+, column/g)).toHaveLength(5);
  });

  it("says one problem in the singular, with its path when the message does not name it", () => {
    expect(problemsSummary([{ code: "x", message: "must be a string.", path: "services.web.run" }])).toBe("1 problem: services.web.run: must be a string.");
  });
});
