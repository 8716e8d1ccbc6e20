import { describe, it, expect } from "vitest";
import { formatConfigPath, isPathElementName, parseConfigPath, type PathSegment } from "../src/index.ts";

describe("config paths", () => {
  it.each<[PathSegment[], string]>([
    [["services", "web", "port"], "services.web.port"],
    [["cron", 0, "enabled"], "cron[0].enabled"],
    [["cron", { name: "nightly" }, "enabled"], "cron[nightly].enabled"],
    [["storage", "drives", { name: "uploads" }, "size_gb"], "storage.drives[uploads].size_gb"],
    [["storage", "drives", 12], "storage.drives[12]"],
    [["services", "my.svc", "run"], 'services["my.svc"].run'],
    [["services", "2web"], 'services["2web"]'],
    [["services", "a\"b"], 'services["a\\"b"]'],
    [["services", ""], 'services[""]'],
    [["memory_mb"], "memory_mb"],
    [["services", "web-2", "memory_mb"], "services.web-2.memory_mb"],
  ])("formats and parses %j as %s", (segments, path) => {
    expect(formatConfigPath(segments)).toBe(path);
    expect(parseConfigPath(path)).toEqual(segments);
  });

  it("formats an empty path as the empty string", () => {
    expect(formatConfigPath([])).toBe("");
  });

  it("refuses to format invalid indices and element names", () => {
    expect(() => formatConfigPath(["cron", -1])).toThrow();
    expect(() => formatConfigPath(["cron", 1.5])).toThrow();
    expect(() => formatConfigPath(["cron", { name: "0abc" }])).toThrow();
    expect(() => formatConfigPath(["cron", { name: "a b" }])).toThrow();
  });

  it.each(["", ".a", "a.", "a..b", "a[", "a[]", "a[01]", "a[-1]", "a[b c]", 'a["x]', 'a["x"', "a b", "a.[0]", 'a[1e3]', "a]"])(
    "does not parse %j",
    (path) => {
      expect(parseConfigPath(path)).toBeNull();
    },
  );

  it("tells element names apart", () => {
    expect(isPathElementName("nightly")).toBe(true);
    expect(isPathElementName("a-b_c")).toBe(true);
    expect(isPathElementName("0")).toBe(false);
    expect(isPathElementName("-a")).toBe(false);
    expect(isPathElementName("")).toBe(false);
  });
});
