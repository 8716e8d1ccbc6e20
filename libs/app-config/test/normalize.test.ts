import { describe, it, expect } from "vitest";
import {
  deriveFeatureFlags,
  httpServices,
  normalizeAppConfig,
  routedServices,
  validateAppConfig,
  type AppConfig,
} from "../src/index.ts";
import { containerConfig, staticConfig } from "./fixtures.ts";

describe("normalizeAppConfig", () => {
  it("applies every default to a minimal container app", () => {
    const config: AppConfig = { services: { web: { run: "node s.js", port: 3000 } } };
    expect(normalizeAppConfig(config)).toEqual({
      type: "container",
      services: { web: { run: "node s.js", port: 3000, replicas: 1, memory_mb: 256, background: false } },
      database: { enabled: false },
      cache: { enabled: false },
      email: { enabled: false },
      storage: { drives: [], buckets: [] },
      cron: [],
    });
  });

  it("keeps declared values and defaults cron enabled to true", () => {
    const config = containerConfig() as AppConfig;
    delete config.cron?.[0]?.enabled;
    const normalized = normalizeAppConfig(config);
    expect(normalized.services.web).toEqual({
      build: "npm ci && npm run build",
      run: "node server.js",
      port: 8080,
      health: "/healthz",
      replicas: 1,
      memory_mb: 256,
      mount: "/",
      background: false,
    });
    expect(normalized.services.worker).toEqual({ run: "node worker.js", background: true, replicas: 1, memory_mb: 256 });
    expect(normalized.database).toEqual({ enabled: true });
    expect(normalized.cache).toEqual({ enabled: false });
    expect(normalized.cron).toEqual([{ name: "nightly", schedule: "0 3 * * *", path: "/cron/nightly", enabled: true }]);
    expect(normalized.storage).toEqual({
      drives: [{ name: "uploads", size_gb: 1, mount: "/data/uploads" }],
      buckets: [{ name: "media" }],
    });
  });

  it("keeps cron enabled false, storage with only buckets gets drives []", () => {
    const normalized = normalizeAppConfig({
      services: { web: { run: "x", port: 1 } },
      storage: { buckets: [{ name: "b" }] },
      cron: [{ name: "a", schedule: "* * * * *", path: "/a", enabled: false }],
    });
    expect(normalized.cron[0]?.enabled).toBe(false);
    expect(normalized.storage).toEqual({ drives: [], buckets: [{ name: "b" }] });
  });

  it("defaults a static app's static block and keeps its services build-only", () => {
    const normalized = normalizeAppConfig({ type: "static", services: { site: { build: "make" } }, static: { dir: "public" } });
    expect(normalized).toEqual({
      type: "static",
      services: { site: { build: "make" } },
      database: { enabled: false },
      cache: { enabled: false },
      email: { enabled: false },
      storage: { drives: [], buckets: [] },
      cron: [],
      static: { dir: "public", spa_fallback: false, index_document: "index.html" },
    });
  });

  it("gives a static app without services an empty services map", () => {
    const normalized = normalizeAppConfig({ type: "static", static: { dir: "dist", spa_fallback: true, index_document: "main.html" } });
    expect(normalized.services).toEqual({});
    expect(normalized.type === "static" && normalized.static).toEqual({ dir: "dist", spa_fallback: true, index_document: "main.html" });
  });

  it("does not modify its input, and its output is still valid", () => {
    const config = containerConfig();
    const before = JSON.stringify(config);
    const normalized = normalizeAppConfig(config as AppConfig);
    expect(JSON.stringify(config)).toBe(before);
    expect(validateAppConfig(normalized)).toEqual([]);
    expect(validateAppConfig(normalizeAppConfig(staticConfig() as AppConfig))).toEqual([]);
  });
});

describe("httpServices and routedServices", () => {
  const config: AppConfig = {
    services: {
      web: { run: "a", port: 8080, mount: "/" },
      worker: { run: "b", background: true },
      internal: { run: "c", port: 9000 },
      api: { run: "d", port: 8081, mount: "/api" },
    },
  };

  it("lists the non-background services with a port, in declaration order", () => {
    expect(httpServices(config).map((s) => s.name)).toEqual(["web", "internal", "api"]);
    expect(httpServices(config)[0]).toEqual({ name: "web", service: { run: "a", port: 8080, mount: "/" } });
  });

  it("lists the services with a mount", () => {
    expect(routedServices(config).map((s) => `${s.name}@${s.service.mount}`)).toEqual(["web@/", "api@/api"]);
  });

  it("gives none for a static app or a config without services", () => {
    expect(httpServices(staticConfig() as AppConfig)).toEqual([]);
    expect(routedServices(staticConfig() as AppConfig)).toEqual([]);
    expect(httpServices({})).toEqual([]);
  });

  it("works on a normalized config", () => {
    expect(httpServices(normalizeAppConfig(config)).map((s) => s.name)).toEqual(["web", "internal", "api"]);
  });
});

describe("deriveFeatureFlags", () => {
  it("reads the enabled flags", () => {
    expect(deriveFeatureFlags(containerConfig() as AppConfig)).toEqual({
      database_enabled: true,
      cache_enabled: false,
      email_enabled: true,
    });
  });

  it("is false for absent sections, and for no config at all", () => {
    expect(deriveFeatureFlags({ services: { web: { run: "x", port: 1 } } })).toEqual({
      database_enabled: false,
      cache_enabled: false,
      email_enabled: false,
    });
    expect(deriveFeatureFlags(null)).toEqual({ database_enabled: false, cache_enabled: false, email_enabled: false });
    expect(deriveFeatureFlags(undefined)).toEqual({ database_enabled: false, cache_enabled: false, email_enabled: false });
  });
});
