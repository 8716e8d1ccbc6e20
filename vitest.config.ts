/**
 * One Vitest run over the whole repository, in two projects:
 * - `unit`: the packages' own tests (libs/*, services/*, gateway, agent): unit tests and
 *   integration tests against the machine's Postgres and NATS, a few files at a time;
 * - `e2e`: the fleet-level tests under test/ (e2e, deploy, fault). Each file starts a fleet of
 *   ten Node processes, so these run one file at a time, after the unit project.
 * test/bench holds benchmarks (`npm run bench`), test/fixtures example apps: neither is run here.
 */
import { defineConfig } from "vitest/config";

const ignored = ["**/node_modules/**", "**/.data/**", "**/.git/**"];

export default defineConfig({
  test: {
    // Inline projects inherit this config, and arrays (include, exclude) are merged, not
    // replaced: so `include` is set per project only, and this `exclude` applies to both.
    exclude: [...ignored, "test/bench/**", "test/fixtures/**"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    teardownTimeout: 30_000,
    // The machine has two cores; integration tests also load Postgres and NATS.
    maxWorkers: 2,
    projects: [
      {
        test: {
          name: "unit",
          include: ["**/test/**/*.test.ts"],
          exclude: ["test/**"],
          sequence: { groupOrder: 0 },
        },
      },
      {
        test: {
          name: "e2e",
          include: ["test/**/*.test.ts"],
          fileParallelism: false,
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
