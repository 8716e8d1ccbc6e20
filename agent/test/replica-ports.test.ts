/**
 * Replica ports: from a range of their own, outside the kernel's ephemeral range, never one a
 * replica here holds or anything listens on.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { expect, it } from "vitest";
import { ephemeralRange, overlaps, parsePortRange, portIsFree, replicaPortIn } from "../src/replica-ports.ts";

it("reads the range of the config and the kernel's ephemeral range, and tells when they overlap", async () => {
  expect(parsePortRange("20000-29999")).toEqual({ first: 20000, last: 29999 });
  const dir = await mkdtemp(path.join(os.tmpdir(), "replica-ports-test-"));
  try {
    await writeFile(path.join(dir, "range"), "32768\t60999\n");
    expect(await ephemeralRange(path.join(dir, "range"))).toEqual({ first: 32768, last: 60999 });
    expect(await ephemeralRange(path.join(dir, "missing"))).toBeNull();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  expect(overlaps({ first: 20000, last: 29999 }, { first: 32768, last: 60999 })).toBe(false);
  expect(overlaps({ first: 30000, last: 40000 }, { first: 32768, last: 60999 })).toBe(true);
  expect(overlaps({ first: 60999, last: 61000 }, { first: 32768, last: 60999 })).toBe(true);
});

it("hands out a port of the range that no replica holds and nothing listens on, and says when there is none", async () => {
  const range = { first: 20000, last: 20003 };
  const busy = new Set([20001]);
  const isFree = async (p: number) => !busy.has(p);
  for (let i = 0; i < 20; i++) expect(await replicaPortIn(range, new Set([20000, 20002]), isFree)).toBe(20003);
  await expect(replicaPortIn(range, new Set([20000, 20002, 20003]), isFree)).rejects.toThrow("No port is free for a replica in AGENT_REPLICA_PORTS (20000-20003).");
});

it("counts a port as taken when anything listens on it, on any address", async () => {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    expect(await portIsFree((server.address() as net.AddressInfo).port)).toBe(false);
  } finally {
    await new Promise((r) => server.close(r));
  }
});
