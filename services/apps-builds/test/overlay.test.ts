import { describe, it, expect } from "vitest";
import type { AppConfig } from "@platform/app-config";
import {
  effectiveConfig,
  isOverlay,
  LIVE_SECTIONS,
  overlayWouldDropFields,
  readSaveConfigBody,
  saveConfig,
  setOverlayEntry,
  sourceMap,
  staleOverlayPaths,
  type Overlay,
} from "../src/domain/overlay.ts";
import { containerConfig } from "../../../libs/app-config/test/fixtures.ts";

/** The ARCHITECTURE section 6 example with a second cron job, as the repository base (a fresh copy each call). */
function base(): Record<string, any> {
  const config = containerConfig();
  config.cron.push({ name: "hourly", schedule: "0 * * * *", path: "/cron/hourly" });
  return config;
}

/** Every leaf path of `base()`, in document order. */
const BASE_LEAVES = [
  "type",
  "services.web.build",
  "services.web.run",
  "services.web.port",
  "services.web.health",
  "services.web.replicas",
  "services.web.memory_mb",
  "services.web.mount",
  "services.worker.run",
  "services.worker.background",
  "database.enabled",
  "cache.enabled",
  "email.enabled",
  "storage.drives[uploads].name",
  "storage.drives[uploads].size_gb",
  "storage.drives[uploads].mount",
  "storage.buckets[media].name",
  "cron[nightly].name",
  "cron[nightly].schedule",
  "cron[nightly].path",
  "cron[nightly].enabled",
  "cron[hourly].name",
  "cron[hourly].schedule",
  "cron[hourly].path",
];

function ok<T extends { ok: boolean }>(result: T): Extract<T, { ok: true }> {
  expect(result.ok, JSON.stringify(result, null, 1)).toBe(true);
  return result as Extract<T, { ok: true }>;
}

function refused<T extends { ok: boolean }>(result: T): Array<{ code: string; path?: string; message: string; line?: number; column?: number }> {
  expect(result.ok, JSON.stringify(result, null, 1)).toBe(false);
  return (result as unknown as { errors: Array<{ code: string; path?: string; message: string }> }).errors;
}

describe("effectiveConfig", () => {
  it("is an empty mapping for no base and no overlay", () => {
    expect(effectiveConfig(null, {})).toEqual({});
    expect(effectiveConfig(undefined, {})).toEqual({});
  });

  it("is a copy of the base for an empty overlay, and never modifies its inputs", () => {
    const repo = base();
    const overlay: Overlay = { "services.web.replicas": { value: 3, base: 1 } };
    const before = JSON.stringify([repo, overlay]);
    const plain = effectiveConfig(repo, {});
    expect(plain).toEqual(repo);
    expect(plain).not.toBe(repo);
    const merged = effectiveConfig(repo, overlay);
    (merged as any).services.web.port = 1;
    expect(JSON.stringify([repo, overlay])).toBe(before);
  });

  it("writes leaf entries over the base and adds fields the base lacks", () => {
    const merged = effectiveConfig(base(), {
      "services.web.replicas": { value: 3, base: 1 },
      "services.worker.memory_mb": { value: 512, base: null },
    }) as any;
    expect(merged.services.web.replicas).toBe(3);
    expect(merged.services.worker).toEqual({ run: "node worker.js", background: true, memory_mb: 512 });
    expect(merged.services.web.port).toBe(8080);
  });

  it("addresses list elements by name, so a reordered repository keeps the edit on the right job", () => {
    const overlay: Overlay = { "cron[hourly].enabled": { value: false, base: null } };
    const repo = base();
    repo.cron = [{ name: "early", schedule: "0 1 * * *", path: "/e" }, ...repo.cron.reverse()];
    const merged = effectiveConfig(repo, overlay) as any;
    expect(merged.cron.map((j: any) => [j.name, j.enabled])).toEqual([
      ["early", undefined],
      ["hourly", false],
      ["nightly", true],
    ]);
  });

  it("accepts an index path too (an element without a usable name)", () => {
    const merged = effectiveConfig(base(), { "cron[1].enabled": { value: false, base: null } }) as any;
    expect(merged.cron[1]).toEqual({ name: "hourly", schedule: "0 * * * *", path: "/cron/hourly", enabled: false });
  });

  it("adds list elements created from the dashboard after the repository's, in name order", () => {
    const merged = effectiveConfig(base(), {
      "cron[zeta].name": { value: "zeta", base: null },
      "cron[zeta].schedule": { value: "0 5 * * *", base: null },
      "cron[zeta].path": { value: "/z", base: null },
      "cron[alpha].path": { value: "/a", base: null },
      "cron[alpha].name": { value: "alpha", base: null },
      "cron[alpha].schedule": { value: "0 6 * * *", base: null },
      "storage.buckets[logs].name": { value: "logs", base: null },
    }) as any;
    expect(merged.cron.map((j: any) => j.name)).toEqual(["nightly", "hourly", "alpha", "zeta"]);
    expect(merged.cron[2]).toEqual({ name: "alpha", schedule: "0 6 * * *", path: "/a" });
    expect(merged.storage.buckets).toEqual([{ name: "media" }, { name: "logs" }]);
  });

  it("creates the sections a new path needs when the base has none", () => {
    expect(
      effectiveConfig(null, {
        "services.web.run": { value: "x", base: null },
        "services.web.port": { value: 80, base: null },
        "storage.buckets[media].name": { value: "media", base: null },
      }),
    ).toEqual({ services: { web: { run: "x", port: 80 } }, storage: { buckets: [{ name: "media" }] } });
  });

  it("leaves out the edits of a service neither layer declares, and applies them again to a base that declares it", () => {
    const overlay: Overlay = { "services.worker.replicas": { value: 3, base: null }, "services.web.replicas": { value: 2, base: 1 } };
    // The repository removed the worker, or a rollback runs a build from before it.
    const withoutWorker = base();
    delete withoutWorker.services.worker;
    const merged = effectiveConfig(withoutWorker, overlay) as any;
    expect(Object.keys(merged.services)).toEqual(["web"]);
    expect(merged.services.web.replicas).toBe(2);
    expect((effectiveConfig(base(), overlay) as any).services.worker).toEqual({ run: "node worker.js", background: true, replicas: 3 });
    // A service the dashboard declares itself is no orphan.
    expect((effectiveConfig(withoutWorker, { ...overlay, "services.worker.run": { value: "node w.js", base: null } }) as any).services.worker).toEqual({ run: "node w.js", replicas: 3 });
  });

  it("lets an entry holding a whole section replace it, and deeper entries apply on top", () => {
    const merged = effectiveConfig(base(), {
      "services.web": { value: { run: "node other.js", port: 9090 }, base: null },
      "services.web.replicas": { value: 2, base: 1 },
    }) as any;
    expect(merged.services.web).toEqual({ run: "node other.js", port: 9090, replicas: 2 });
  });

  it("ignores entries with an invalid path or shape, and a name leaf that would rename", () => {
    const overlay = {
      "services..web": { value: 1, base: null },
      "[0].x": { value: 1, base: null },
      "services.web.port": { nope: 1 },
      "cron[nightly].name": { value: "renamed", base: "nightly" },
    } as unknown as Overlay;
    expect(effectiveConfig(base(), overlay)).toEqual(base());
  });

  it("never writes to a prototype", () => {
    const merged = effectiveConfig(base(), {
      '["__proto__"].polluted': { value: true, base: null },
      'services["__proto__"].polluted': { value: true, base: null },
    }) as any;
    expect(({} as any).polluted).toBeUndefined();
    expect(Object.hasOwn(merged, "__proto__")).toBe(true);
  });
});

describe("sourceMap", () => {
  it("marks every leaf of the base as repository for an empty overlay", () => {
    const map = sourceMap(base(), {});
    expect(Object.keys(map)).toEqual(BASE_LEAVES);
    expect(new Set(Object.values(map))).toEqual(new Set(["repository"]));
  });

  it("marks overlaid leaves, and every leaf under an overlaid section, as dashboard", () => {
    const map = sourceMap(base(), {
      "services.web.replicas": { value: 3, base: 1 },
      "cron[hourly].enabled": { value: false, base: null },
      storage: { value: { buckets: [{ name: "media" }] }, base: null },
    });
    const dashboard = Object.entries(map)
      .filter(([, source]) => source === "dashboard")
      .map(([path]) => path);
    expect(dashboard).toEqual(["services.web.replicas", "storage.buckets[media].name", "cron[hourly].enabled"]);
    expect(map["services.web.port"]).toBe("repository");
    expect(map["storage.drives[uploads].name"]).toBeUndefined();
  });

  it("covers empty sections as leaves", () => {
    const map = sourceMap({ services: { web: { run: "x", port: 1 } }, cron: [] }, { "storage.drives": { value: [], base: null } });
    expect(map).toEqual({
      "services.web.run": "repository",
      "services.web.port": "repository",
      cron: "repository",
      "storage.drives": "dashboard",
    });
  });

  it("marks a dashboard-created list element by its name", () => {
    const map = sourceMap(base(), {
      "cron[weekly].name": { value: "weekly", base: null },
      "cron[weekly].schedule": { value: "0 0 * * 0", base: null },
      "cron[weekly].path": { value: "/w", base: null },
    });
    expect(map["cron[weekly].name"]).toBe("dashboard");
    expect(map["cron[weekly].schedule"]).toBe("dashboard");
    expect(map["cron[nightly].name"]).toBe("repository");
  });

  it("maps an index-written overlay path onto the element's name", () => {
    const map = sourceMap(base(), { "cron[1].enabled": { value: false, base: null } });
    expect(map["cron[hourly].enabled"]).toBe("dashboard");
    expect(map["cron[hourly].path"]).toBe("repository");
  });

  it("lists only the overlay for a config authored in the dashboard", () => {
    expect(sourceMap(null, { "services.web.run": { value: "x", base: null } })).toEqual({ "services.web.run": "dashboard" });
  });
});

describe("overlayWouldDropFields", () => {
  it("is empty for leaf edits and for no base", () => {
    expect(overlayWouldDropFields(base(), {})).toEqual([]);
    expect(overlayWouldDropFields(base(), { "services.web.replicas": { value: 3, base: 1 } })).toEqual([]);
    expect(overlayWouldDropFields(null, { services: { value: {}, base: null } })).toEqual([]);
  });

  it("lists the repository fields an entry replacing a whole section drops, sorted", () => {
    const overlay: Overlay = { "services.web": { value: { replicas: 2 }, base: null } };
    expect(overlayWouldDropFields(base(), overlay)).toEqual([
      "services.web.build",
      "services.web.health",
      "services.web.memory_mb",
      "services.web.mount",
      "services.web.port",
      "services.web.run",
    ]);
  });

  it("does not list fields that a deeper entry puts back", () => {
    const overlay: Overlay = {
      "services.web": { value: { replicas: 2, run: "node server.js", port: 8080 }, base: null },
      "services.web.build": { value: "make", base: null },
    };
    expect(overlayWouldDropFields(base(), overlay)).toEqual(["services.web.health", "services.web.memory_mb", "services.web.mount"]);
  });

  it("lists fields dropped by a scalar written over a section, and by a replaced list", () => {
    expect(overlayWouldDropFields(base(), { storage: { value: null, base: null } })).toEqual([
      "storage.buckets[media].name",
      "storage.drives[uploads].mount",
      "storage.drives[uploads].name",
      "storage.drives[uploads].size_gb",
    ]);
    expect(overlayWouldDropFields(base(), { cron: { value: [base().cron[1]], base: null } })).toEqual([
      "cron[nightly].enabled",
      "cron[nightly].name",
      "cron[nightly].path",
      "cron[nightly].schedule",
    ]);
  });
});

describe("staleOverlayPaths", () => {
  it("lists entries whose recorded base is no longer the repository's value", () => {
    const overlay: Overlay = {
      "services.web.replicas": { value: 3, base: 1 },
      "services.web.port": { value: 9000, base: 8000 },
      "services.worker.memory_mb": { value: 512, base: null },
      "cache.enabled": { value: true, base: null },
    };
    expect(staleOverlayPaths(base(), overlay)).toEqual(["cache.enabled", "services.web.port"]);
    expect(staleOverlayPaths(null, overlay)).toEqual(["services.web.port", "services.web.replicas"]);
  });
});

describe("setOverlayEntry", () => {
  it("records a dashboard edit with the repository's current value as base", () => {
    const overlay = setOverlayEntry(base(), {}, "services.web.replicas", 3);
    expect(overlay).toEqual({ "services.web.replicas": { value: 3, base: 1 } });
  });

  it("records base null where the repository has no value", () => {
    expect(setOverlayEntry(base(), {}, "services.worker.replicas", 2)).toEqual({
      "services.worker.replicas": { value: 2, base: null },
    });
  });

  it("removes the entry when the value is set back to the repository's", () => {
    const overlay = setOverlayEntry(base(), { "services.web.replicas": { value: 3, base: 1 }, "cache.enabled": { value: true, base: false } }, "services.web.replicas", 1);
    expect(overlay).toEqual({ "cache.enabled": { value: true, base: false } });
  });

  it("toggles a cron job by name and writes canonical paths", () => {
    expect(setOverlayEntry(base(), {}, "cron[nightly].enabled", false)).toEqual({
      "cron[nightly].enabled": { value: false, base: true },
    });
    expect(Object.keys(setOverlayEntry(base(), {}, 'services["web"].port', 1))).toEqual(["services.web.port"]);
  });

  it("edits inside an ancestor entry that replaces the section", () => {
    const overlay: Overlay = { "services.web": { value: { run: "x", port: 1 }, base: null } };
    expect(setOverlayEntry(base(), overlay, "services.web.replicas", 2)).toEqual({
      "services.web": { value: { run: "x", port: 1, replicas: 2 }, base: null },
    });
    expect(overlay["services.web"]?.value).toEqual({ run: "x", port: 1 });
  });

  it("supersedes entries under a section it replaces", () => {
    const overlay: Overlay = { "services.web.replicas": { value: 2, base: 1 }, "cache.enabled": { value: true, base: false } };
    const out = setOverlayEntry(base(), overlay, "services.web", { run: "y", port: 2 });
    expect(Object.keys(out).sort()).toEqual(["cache.enabled", "services.web"]);
    expect(out["services.web"]?.base).toEqual(base().services.web);
  });

  it("throws on a path that is not a config path", () => {
    expect(() => setOverlayEntry(base(), {}, "services..web", 1)).toThrow(/not a config path/);
    expect(() => setOverlayEntry(base(), {}, "[0]", 1)).toThrow(/not a config path/);
  });
});

describe("isOverlay", () => {
  it("accepts overlays", () => {
    expect(isOverlay({})).toBe(true);
    expect(isOverlay({ "services.web.replicas": { value: 2, base: 1 }, "cron[a].enabled": { value: false, base: null } })).toBe(true);
  });

  it.each([
    null,
    [],
    "x",
    { "services.web.replicas": 2 },
    { "services.web.replicas": { value: 2 } },
    { "services.web.replicas": { value: 2, base: 1, extra: 0 } },
    { "services..web": { value: 2, base: null } },
    { "[0]": { value: 2, base: null } },
  ])("refuses %j", (value) => {
    expect(isOverlay(value)).toBe(false);
  });
});

describe("readSaveConfigBody", () => {
  it("accepts config as an object", () => {
    const result = ok(readSaveConfigBody({ config: base() }));
    expect(result.submitted).toEqual(base());
    expect(result.locate).toBeUndefined();
  });

  it("accepts config_yaml and gives a locator", () => {
    const result = ok(readSaveConfigBody({ config_yaml: "services:\n  web:\n    run: x\n    port: 1\n" }));
    expect(result.submitted).toEqual({ services: { web: { run: "x", port: 1 } } });
    expect(result.locate?.("services.web.port")).toEqual({ line: 4, column: 5 });
  });

  it("treats a null field as absent", () => {
    ok(readSaveConfigBody({ config: base(), config_yaml: null }));
    ok(readSaveConfigBody({ config: null, config_yaml: "a: 1\n" }));
  });

  it.each([
    [{ config: {}, config_yaml: "" }, "both_config_fields"],
    [{ config_yaml: "type: container\n", branch: "dev" }, "unknown_field"],
    [{}, "missing_config"],
    [{ config: null }, "missing_config"],
    [{ config_yaml: 5 }, "config_yaml_not_string"],
    [{ config_yaml: { a: 1 } }, "config_yaml_not_string"],
    [null, "invalid_body"],
    ["config", "invalid_body"],
    [[{ config: {} }], "invalid_body"],
    [{ config: [] }, "not_a_mapping"],
    [{ config: "type: static" }, "not_a_mapping"],
    [{ config_yaml: "- a\n" }, "not_a_mapping"],
    [{ config_yaml: "" }, "not_a_mapping"],
    [{ config_yaml: "a: [1\n" }, "yaml_syntax"],
    [{ config_yaml: `# ${"x".repeat(64 * 1024)}\n` }, "too_large"],
    [{ config_yaml: `a: ${"[".repeat(20)}${"]".repeat(20)}\n` }, "too_deep"],
  ])("refuses %j with %s", (body, code) => {
    const errors = refused(readSaveConfigBody(body));
    expect(errors[0]?.code).toBe(code);
  });

  it("bounds a config object: depth, node count and its size written as YAML", () => {
    const deep = (n: number): unknown => (n === 0 ? 1 : { a: deep(n - 1) });
    expect(refused(readSaveConfigBody({ config: deep(17) }))[0]?.code).toBe("too_deep");
    expect(refused(readSaveConfigBody({ config: { a: Array(10_001).fill(0) } }))[0]?.code).toBe("too_many_nodes");
    // 30 services of 4,000 characters each: few nodes, far past 64 KiB, in either form.
    const services = Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`s${i}`, { run: "x".repeat(4000), port: 3000 + i }]));
    expect(refused(readSaveConfigBody({ config: { services } }))[0]).toMatchObject({ code: "too_large", message: expect.stringContaining("64 KiB") });
    expect(ok(readSaveConfigBody({ config: { services: { s0: services.s0 } } })).submitted).toEqual({ services: { s0: services.s0 } });
  });

  it("reports a YAML syntax error with line and column", () => {
    const [error] = refused(readSaveConfigBody({ config_yaml: "services:\n  web:\n    run: x\n  port 1\n    x: 2\n" }));
    expect(error).toMatchObject({ code: "yaml_syntax", line: 4, column: 3 });
    expect(error?.message).toContain("line 4, column 3");
  });
});

describe("saveConfig", () => {
  it("stores nothing for a submission equal to the base", () => {
    expect(saveConfig(base(), {}, base())).toEqual({
      ok: true,
      overlay: {},
      changedPaths: [],
      appliesLive: false,
      requiresRedeploy: false,
      effective: base(),
    });
  });

  it("stores only the differences, with the repository's value as base", () => {
    const submitted = base();
    submitted.services.web.replicas = 2;
    submitted.services.worker.memory_mb = 512;
    const result = ok(saveConfig(base(), {}, submitted));
    expect(result.overlay).toEqual({
      "services.web.replicas": { value: 2, base: 1 },
      "services.worker.memory_mb": { value: 512, base: null },
    });
    expect(result.changedPaths).toEqual(["services.web.replicas", "services.worker.memory_mb"]);
    expect(result.requiresRedeploy).toBe(true);
    expect(result.appliesLive).toBe(false);
    expect(result.effective).toEqual(submitted);
  });

  it("a replicas-only change requires a redeploy (the scale route redeploys the running image)", () => {
    const submitted = base();
    submitted.services.web.replicas = 3;
    const result = ok(saveConfig(base(), {}, submitted));
    expect([result.appliesLive, result.requiresRedeploy]).toEqual([false, true]);
  });

  it("cron-only changes apply live: enabled, schedule, path and added jobs", () => {
    expect(LIVE_SECTIONS).toEqual(["cron"]);
    const submitted = base();
    submitted.cron[1].enabled = false;
    submitted.cron[0].schedule = "30 3 * * *";
    submitted.cron.push({ name: "weekly", schedule: "0 0 * * 0", path: "/cron/weekly" });
    const result = ok(saveConfig(base(), {}, submitted));
    expect(result.overlay).toEqual({
      "cron[nightly].schedule": { value: "30 3 * * *", base: "0 3 * * *" },
      "cron[hourly].enabled": { value: false, base: null },
      "cron[weekly].name": { value: "weekly", base: null },
      "cron[weekly].schedule": { value: "0 0 * * 0", base: null },
      "cron[weekly].path": { value: "/cron/weekly", base: null },
    });
    expect(result.changedPaths).toEqual([
      "cron[hourly].enabled",
      "cron[nightly].schedule",
      "cron[weekly].name",
      "cron[weekly].path",
      "cron[weekly].schedule",
    ]);
    expect([result.appliesLive, result.requiresRedeploy]).toEqual([true, false]);
  });

  it("a mix of cron and other changes requires a redeploy and is not live", () => {
    const submitted = base();
    submitted.cron[1].enabled = false;
    submitted.cache.enabled = true;
    const result = ok(saveConfig(base(), {}, submitted));
    expect([result.appliesLive, result.requiresRedeploy]).toEqual([false, true]);
  });

  it.each<[string, (c: any) => void]>([
    ["database.enabled", (c) => (c.database.enabled = false)],
    ["storage.drives[uploads].size_gb", (c) => (c.storage.drives[0].size_gb = 5)],
    ["services.web.build", (c) => (c.services.web.build = "make")],
    ["services.web.mount", (c) => (c.services.web.mount = "/app")],
  ])("a change of %s requires a redeploy", (path, edit) => {
    const submitted = base();
    edit(submitted);
    const result = ok(saveConfig(base(), {}, submitted));
    expect(result.changedPaths).toEqual([path]);
    expect([result.appliesLive, result.requiresRedeploy]).toEqual([false, true]);
  });

  it("ignores list order: reordering the repository's entries stores nothing", () => {
    const submitted = base();
    submitted.cron.reverse();
    const result = ok(saveConfig(base(), {}, submitted));
    expect(result.overlay).toEqual({});
    expect(result.changedPaths).toEqual([]);
  });

  it("refuses omissions of repository fields, one problem per omitted path", () => {
    const submitted = base();
    delete submitted.services.web.health;
    submitted.cron.splice(1, 1);
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => `${e.code}@${e.path}`)).toEqual([
      "omitted_repository_field@services.web.health",
      "omitted_repository_field@cron[hourly].name",
      "omitted_repository_field@cron[hourly].schedule",
      "omitted_repository_field@cron[hourly].path",
    ]);
    expect(errors[0]?.message).toContain("omission never unsets");
  });

  it("refuses omitting a whole section the repository defines", () => {
    const submitted = base();
    delete submitted.storage;
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => e.path)).toEqual([
      "storage.drives[uploads].name",
      "storage.drives[uploads].size_gb",
      "storage.drives[uploads].mount",
      "storage.buckets[media].name",
    ]);
    expect(new Set(errors.map((e) => e.code))).toEqual(new Set(["omitted_repository_field"]));
  });

  it("refuses an empty list over the repository's entries as omissions", () => {
    const submitted = base();
    submitted.storage.buckets = [];
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => `${e.code}@${e.path}`)).toEqual(["omitted_repository_field@storage.buckets[media].name"]);
  });

  it("refuses renaming a repository list entry (its old name's fields are omitted)", () => {
    const submitted = base();
    submitted.cron[1].name = "every-hour";
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => e.path)).toEqual(["cron[hourly].name", "cron[hourly].schedule", "cron[hourly].path"]);
  });

  it("reports an omitted required field as an omission, not as a missing field", () => {
    const submitted = base();
    delete submitted.services.web.run;
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => `${e.code}@${e.path}`)).toEqual(["omitted_repository_field@services.web.run"]);
  });

  it("lets a dashboard-added field be dropped by omitting it", () => {
    const current: Overlay = {
      "services.worker.memory_mb": { value: 512, base: null },
      "cron[weekly].name": { value: "weekly", base: null },
      "cron[weekly].schedule": { value: "0 0 * * 0", base: null },
      "cron[weekly].path": { value: "/w", base: null },
    };
    const result = ok(saveConfig(base(), current, base()));
    expect(result.overlay).toEqual({});
    expect(result.changedPaths).toEqual(["cron[weekly].name", "cron[weekly].path", "cron[weekly].schedule", "services.worker.memory_mb"]);
    expect(result.requiresRedeploy).toBe(true);
  });

  it("reverting a dashboard edit to the repository's value removes the entry", () => {
    const current: Overlay = { "cron[nightly].enabled": { value: false, base: true } };
    const result = ok(saveConfig(base(), current, base()));
    expect(result.overlay).toEqual({});
    expect(result.changedPaths).toEqual(["cron[nightly].enabled"]);
    expect([result.appliesLive, result.requiresRedeploy]).toEqual([true, false]);
  });

  it("compares against the current effective config: re-saving the same edit changes nothing", () => {
    const current: Overlay = { "services.web.replicas": { value: 2, base: 1 } };
    const submitted = base();
    submitted.services.web.replicas = 2;
    const result = ok(saveConfig(base(), current, submitted));
    expect(result.overlay).toEqual(current);
    expect(result.changedPaths).toEqual([]);
    expect([result.appliesLive, result.requiresRedeploy]).toEqual([false, false]);
  });

  it("keeps an unchanged entry's recorded base; a changed value records the current repository value", () => {
    const current: Overlay = {
      "services.web.replicas": { value: 2, base: 3 },
      "services.web.port": { value: 9000, base: 7000 },
    };
    const submitted = base();
    submitted.services.web.replicas = 2;
    submitted.services.web.port = 9001;
    const result = ok(saveConfig(base(), current, submitted));
    expect(result.overlay).toEqual({
      "services.web.replicas": { value: 2, base: 3 },
      "services.web.port": { value: 9001, base: 8080 },
    });
  });

  it("validates the merged config and returns every problem", () => {
    const submitted = base();
    submitted.services.web.port = 0;
    submitted.services.web.replicas = "2";
    submitted.services.web.prot = 80;
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => `${e.code}@${e.path}`)).toEqual([
      "unknown_key@services.web.prot",
      "out_of_range@services.web.port",
      "wrong_type@services.web.replicas",
    ]);
  });

  it("points validation problems into the submitted document even when list order differs", () => {
    const submitted = base();
    submitted.cron = [
      { name: "broken", schedule: "every day", path: "/b" },
      submitted.cron[1],
      submitted.cron[0],
    ];
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => `${e.code}@${e.path}`)).toEqual(["invalid_format@cron[0].schedule"]);
  });

  it("refuses a duplicate name, not merging the entries", () => {
    const submitted = base();
    submitted.cron.push({ name: "nightly", schedule: "0 4 * * *", path: "/again" });
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.some((e) => e.code === "duplicate")).toBe(true);
  });

  it("applies the bounds and refuses a submission that is not a mapping", () => {
    const deep = (n: number): unknown => (n === 0 ? 1 : { a: deep(n - 1) });
    expect(refused(saveConfig(base(), {}, deep(20)))[0]?.code).toBe("too_deep");
    expect(refused(saveConfig(base(), {}, { a: Array(20_000).fill(1) }))[0]?.code).toBe("too_many_nodes");
    expect(refused(saveConfig(base(), {}, [base()]))[0]?.code).toBe("not_a_mapping");
    expect(refused(saveConfig(base(), {}, null))[0]?.code).toBe("not_a_mapping");
  });

  it("stores a whole config authored in the dashboard when the repository has none", () => {
    const submitted = { services: { web: { run: "node s.js", port: 3000 } }, database: { enabled: true } };
    const result = ok(saveConfig(null, {}, submitted));
    expect(result.overlay).toEqual({
      "services.web.run": { value: "node s.js", base: null },
      "services.web.port": { value: 3000, base: null },
      "database.enabled": { value: true, base: null },
    });
    expect(result.effective).toEqual(submitted);
    expect(effectiveConfig(null, result.overlay)).toEqual(submitted);
    expect(refused(saveConfig(null, {}, {})).map((e) => `${e.code}@${e.path}`)).toEqual(["required@services"]);
  });

  it("the stored overlay reproduces the submission as the effective config", () => {
    const submitted = base();
    submitted.services.api = { run: "node api.js", port: 8081, mount: "/api" };
    submitted.storage.buckets.push({ name: "logs" });
    submitted.email.enabled = false;
    const result = ok(saveConfig(base(), {}, submitted));
    expect(effectiveConfig(base(), result.overlay)).toEqual(submitted);
    expect(overlayWouldDropFields(base(), result.overlay)).toEqual([]);
    const dashboard = Object.entries(sourceMap(base(), result.overlay)).filter(([, s]) => s === "dashboard").map(([p]) => p);
    expect(dashboard.sort()).toEqual([
      "email.enabled",
      "services.api.mount",
      "services.api.port",
      "services.api.run",
      "storage.buckets[logs].name",
    ]);
  });

  it("handles a static app", () => {
    const repo: AppConfig = { type: "static", services: { site: { build: "npm run build" } }, static: { dir: "dist" } };
    const submitted = { ...repo, static: { dir: "dist", spa_fallback: true } };
    const result = ok(saveConfig(repo, {}, submitted));
    expect(result.overlay).toEqual({ "static.spa_fallback": { value: true, base: null } });
    expect(result.requiresRedeploy).toBe(true);
    const invalid = { ...repo, services: { site: { build: "x", run: "node s.js" } } };
    expect(refused(saveConfig(repo, {}, invalid)).map((e) => `${e.code}@${e.path}`)).toEqual(["not_allowed@services.site.run"]);
  });

  it("refuses a __proto__ key without polluting anything", () => {
    const submitted = JSON.parse(JSON.stringify(base()).replace('"type":"container"', '"type":"container","__proto__":{"polluted":true}'));
    const errors = refused(saveConfig(base(), {}, submitted));
    expect(errors.map((e) => `${e.code}@${e.path}`)).toEqual(["unknown_key@__proto__"]);
    expect(({} as any).polluted).toBeUndefined();
  });

  it("adds line and column to problems of a YAML submission", () => {
    const body = ok(
      readSaveConfigBody({
        config_yaml: "type: container\nservices:\n  web:\n    run: node s.js\n    port: 99999\n",
      }),
    );
    const errors = refused(saveConfig(null, {}, body.submitted, { locate: body.locate }));
    expect(errors).toEqual([expect.objectContaining({ code: "out_of_range", path: "services.web.port", line: 5, column: 5 })]);
  });
});
