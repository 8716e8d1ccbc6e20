/** Shared fixtures of the app-config tests. */
import { expect } from "vitest";
import type { ConfigProblem } from "../src/index.ts";

/** The example of ARCHITECTURE section 6 (without its static line, which is for static apps). */
export const ARCHITECTURE_EXAMPLE = `type: container            # or: static
services:
  web:
    build: npm ci && npm run build     # optional, run in the repo root
    run: node server.js                # the process to start
    port: 8080                         # the service gets PORT set to the port it must listen on
    health: /healthz                   # HTTP path checked before the swap
    replicas: 1                        # 1-3
    memory_mb: 256
    mount: /                           # path routing on the front door; absent = unrouted
  worker:
    run: node worker.js
    background: true                   # no HTTP port, never checked
database: { enabled: true }
cache: { enabled: false }
email: { enabled: true }
storage:
  drives:  [{ name: uploads, size_gb: 1, mount: /data/uploads }]
  buckets: [{ name: media }]
cron:
  - { name: nightly, schedule: "0 3 * * *", path: /cron/nightly, enabled: true }
`;

export const STATIC_EXAMPLE = `type: static
services:
  site:
    build: npm ci && npm run build
static: { dir: dist, spa_fallback: true, index_document: index.html }
`;

/** A full, valid container config as a fresh object (tests mutate it). */
export function containerConfig(): Record<string, any> {
  return {
    type: "container",
    services: {
      web: {
        build: "npm ci && npm run build",
        run: "node server.js",
        port: 8080,
        health: "/healthz",
        replicas: 1,
        memory_mb: 256,
        mount: "/",
      },
      worker: { run: "node worker.js", background: true },
    },
    database: { enabled: true },
    cache: { enabled: false },
    email: { enabled: true },
    storage: {
      drives: [{ name: "uploads", size_gb: 1, mount: "/data/uploads" }],
      buckets: [{ name: "media" }],
    },
    cron: [{ name: "nightly", schedule: "0 3 * * *", path: "/cron/nightly", enabled: true }],
  };
}

export function staticConfig(): Record<string, any> {
  return {
    type: "static",
    services: { site: { build: "npm run build" } },
    static: { dir: "dist", spa_fallback: true, index_document: "index.html" },
  };
}

/**
 * Asserts exactly one problem, with `code`, and at `path` when given (`null`: a whole-document
 * problem, without a path).
 */
export function expectOne(problems: ConfigProblem[], code: string, path?: string | null): ConfigProblem {
  expect(problems, JSON.stringify(problems, null, 1)).toHaveLength(1);
  const [problem] = problems as [ConfigProblem];
  expect(problem.code).toBe(code);
  if (path === null) expect(problem.path).toBeUndefined();
  else if (path !== undefined) expect(problem.path).toBe(path);
  expect(problem.message.length).toBeGreaterThan(10);
  return problem;
}

/** Asserts a problem with `code` at `path` is among `problems`. */
export function expectHas(problems: ConfigProblem[], code: string, path?: string): ConfigProblem {
  const found = problems.find((p) => p.code === code && p.path === path);
  expect(found, `${code} at ${path} in ${JSON.stringify(problems, null, 1)}`).toBeDefined();
  return found as ConfigProblem;
}
