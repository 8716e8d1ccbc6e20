import { describe, it, expect } from "vitest";
import { normalizeAppConfig, parseAppConfigYaml, renderAppConfigYaml, type AppConfig } from "../src/index.ts";
import { containerConfig, staticConfig } from "./fixtures.ts";

const EXPECTED = `type: container
services:
  web:
    build: npm ci && npm run build
    run: node server.js
    port: 8080
    health: /healthz
    replicas: 1
    memory_mb: 256
    mount: /
  worker:
    run: node worker.js
    background: true
database: { enabled: true }
cache: { enabled: false }
email: { enabled: true }
storage:
  drives:
    - name: uploads
      size_gb: 1
      mount: /data/uploads
  buckets:
    - name: media
cron:
  - name: nightly
    schedule: 0 3 * * *
    path: /cron/nightly
    enabled: true
`;

/** The same config with every mapping's keys in reverse order (as after a JSONB round trip). */
function reversed(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reversed);
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(Object.entries(value).reverse().map(([k, v]) => [k, reversed(v)]));
  }
  return value;
}

describe("renderAppConfigYaml", () => {
  it("renders the ARCHITECTURE example in its key order", () => {
    expect(renderAppConfigYaml(containerConfig() as AppConfig)).toBe(EXPECTED);
  });

  it("is stable whatever the key order of its input (services keep their order)", () => {
    const shuffled = reversed(containerConfig()) as AppConfig;
    const rendered = renderAppConfigYaml(shuffled);
    expect(rendered.split("\n").filter((l) => /^\S/.test(l))).toEqual([
      "type: container",
      "services:",
      "database: { enabled: true }",
      "cache: { enabled: false }",
      "email: { enabled: true }",
      "storage:",
      "cron:",
    ]);
    // Services in the given order (worker first here), each service's keys in schema order.
    expect(rendered).toContain("services:\n  worker:\n    run: node worker.js\n    background: true\n  web:\n    build:");
    expect(renderAppConfigYaml(shuffled)).toBe(rendered);
  });

  it("round-trips through parseAppConfigYaml", () => {
    for (const config of [containerConfig(), staticConfig(), normalizeAppConfig(containerConfig() as AppConfig)]) {
      const parsed = parseAppConfigYaml(renderAppConfigYaml(config as AppConfig));
      expect(parsed).toEqual({ ok: true, config });
    }
  });

  it("quotes strings that would read as other types or syntax", () => {
    const config: AppConfig = {
      services: { web: { run: "echo a: b #c", build: "true", port: 1, health: "/h?x=1" }, api: { run: "*start", build: "123", port: 2 } },
      cron: [{ name: "n", schedule: "*/5 * * * *", path: "/c" }],
    };
    const parsed = parseAppConfigYaml(renderAppConfigYaml(config));
    expect(parsed).toEqual({ ok: true, config });
  });

  it("does not fold long commands", () => {
    const run = `node ${"x".repeat(200)} --flag value`;
    const rendered = renderAppConfigYaml({ services: { web: { run, port: 1 } } });
    expect(rendered).toContain(`run: ${run}\n`);
  });

  it("renders a static app with its static block last", () => {
    expect(renderAppConfigYaml(staticConfig() as AppConfig)).toBe(`type: static
services:
  site:
    build: npm run build
static:
  dir: dist
  spa_fallback: true
  index_document: index.html
`);
  });

  it("renders empty sections and drops undefined fields", () => {
    const config: AppConfig = {
      services: { web: { run: "x", port: 1, mount: undefined } },
      storage: { drives: [] },
      cron: [],
    };
    expect(renderAppConfigYaml(config)).toBe("services:\n  web:\n    run: x\n    port: 1\nstorage:\n  drives: []\ncron: []\n");
  });

  it("renders an empty config as an empty mapping", () => {
    expect(renderAppConfigYaml({})).toBe("{}\n");
  });
});
