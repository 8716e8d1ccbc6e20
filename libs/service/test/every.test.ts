/**
 * The periodic runner behind every service's upkeep (ledger pruning, log retention, queue pruning,
 * redispatch): an hourly job first runs within a minute of start, so a service restarted more often
 * than hourly still does its upkeep.
 */
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { every } from "../src/index.ts";

beforeEach(() => void vi.useFakeTimers());
afterEach(() => void vi.useRealTimers());

it("runs an hourly job a minute after start, then every hour", async () => {
  const runs: number[] = [];
  const start = Date.now();
  const job = every(3600_000, async () => void runs.push(Date.now() - start));
  await vi.advanceTimersByTimeAsync(59_999);
  expect(runs).toEqual([]);
  await vi.advanceTimersByTimeAsync(1);
  expect(runs).toEqual([60_000]);
  await vi.advanceTimersByTimeAsync(2 * 3600_000);
  expect(runs).toEqual([60_000, 3660_000, 7260_000]);
  await job.stop();
  await vi.advanceTimersByTimeAsync(3600_000);
  expect(runs).toHaveLength(3);
});

it("runs a job shorter than a minute first after its own interval", async () => {
  const runs: number[] = [];
  const start = Date.now();
  const job = every(30_000, async () => void runs.push(Date.now() - start));
  await vi.advanceTimersByTimeAsync(90_000);
  expect(runs).toEqual([30_000, 60_000, 90_000]);
  await job.stop();
});

it("never runs a job twice at once, and stop waits for the run in progress", async () => {
  let active = 0;
  let most = 0;
  let finished = 0;
  const job = every(1_000, async () => {
    active++;
    most = Math.max(most, active);
    await new Promise((r) => setTimeout(r, 2_500));
    active--;
    finished++;
  });
  await vi.advanceTimersByTimeAsync(5_000);
  expect(most).toBe(1);
  const stopping = job.stop();
  await vi.advanceTimersByTimeAsync(2_500);
  await stopping;
  expect(active).toBe(0);
  expect(finished).toBeGreaterThanOrEqual(2);
});

it("never runs a job stopped before its first run", async () => {
  let ran = false;
  const job = every(3600_000, async () => void (ran = true));
  await job.stop();
  await vi.advanceTimersByTimeAsync(2 * 3600_000);
  expect(ran).toBe(false);
});
