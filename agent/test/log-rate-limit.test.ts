import { expect, it } from "vitest";
import { LogRateLimit } from "../src/log-rate-limit.ts";

function limited(perMinute: number) {
  let now = 1_000_000;
  const limit = new LogRateLimit<string>({ perMinute, now: () => now });
  return { limit, advance: (ms: number) => (now += ms), admitted: (replica: string, n: number) => Array.from({ length: n }, () => limit.admit(replica, "ctx")).filter(Boolean).length };
}

it("lets a replica ship a minute's worth at once, then the rest of its allowance evenly", () => {
  const { admitted, advance } = limited(600);
  expect(admitted("r1", 1000)).toBe(600);
  advance(1_000);
  expect(admitted("r1", 100)).toBe(10);
  advance(60_000);
  expect(admitted("r1", 1000)).toBe(600);
});

it("keeps each replica's allowance apart", () => {
  const { admitted } = limited(60);
  expect(admitted("flood", 1000)).toBe(60);
  expect(admitted("quiet", 10)).toBe(10);
});

it("tells once per call how many lines each replica lost since when, with the context of the last one", () => {
  const { limit, admitted, advance } = limited(60);
  expect(limit.notices()).toEqual([]);
  admitted("r1", 100);
  const first = new Date(1_000_000);
  advance(500);
  expect(limit.admit("r1", "last")).toBe(false);
  expect(limit.notices()).toEqual([{ key: "r1", dropped: 41, since: first, context: "last" }]);
  expect(limit.notices()).toEqual([]);
});

it("ships everything when the limit is 0", () => {
  const { admitted, limit } = limited(0);
  expect(admitted("r1", 100_000)).toBe(100_000);
  expect(limit.notices()).toEqual([]);
});
