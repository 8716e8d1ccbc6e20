/**
 * What a heartbeat tells of its host: the facts and the load of the spec's agent object (doc 2),
 * read off this machine.
 */
import { expect, it } from "vitest";
import os from "node:os";
import { LoadSampler, sampleHeartbeat } from "../src/heartbeat.ts";

const runtime = () => ({ name: "process", inventory: [], containers: { running: 0, total: 0 } });

it("carries the host's facts under the spec's keys, each 1-256 characters, and the boot time steady between beats", async () => {
  const load = new LoadSampler();
  const hb = await sampleHeartbeat("host-1", "1.0.0", new Date(), os.tmpdir(), runtime, load);
  expect(hb.host_facts).toMatchObject({ kernel: os.release(), arch: os.machine() });
  expect(Object.keys(hb.host_facts).every((k) => ["os", "kernel", "docker_version", "instance_type", "az", "ami", "arch", "booted_at"].includes(k))).toBe(true);
  for (const v of Object.values(hb.host_facts)) expect(v).toMatch(/^.{1,256}$/s);
  expect(hb.host_facts.os).toBeTruthy();
  const booted = Date.parse(hb.host_facts.booted_at!);
  expect(Math.abs(booted - (Date.now() - os.uptime() * 1000))).toBeLessThan(2_000);
  await new Promise((r) => setTimeout(r, 600));
  const again = await sampleHeartbeat("host-1", "1.0.0", new Date(), os.tmpdir(), runtime, load);
  expect(again.host_facts.booted_at).toBe(hb.host_facts.booted_at);
});

it("samples the CPU over the time since the last beat, within 0-100, and repeats a sample for a beat right after", async () => {
  const load = new LoadSampler();
  const first = await load.sample();
  expect(first.cpu_pct).toBeGreaterThanOrEqual(0);
  expect(first.cpu_pct).toBeLessThanOrEqual(100);
  expect(first).toMatchObject({ load_1m: expect.any(Number), load_5m: expect.any(Number), load_15m: expect.any(Number) });
  expect(Date.now() - Date.parse(first.sampled_at)).toBeLessThan(1_000);

  // One core busy for 600 ms: at least its share of all the host's CPUs shows.
  await new Promise((r) => setTimeout(r, 300));
  const until = Date.now() + 600;
  while (Date.now() < until) Math.sqrt(Math.random());
  const busy = await load.sample();
  expect(busy.cpu_pct).toBeGreaterThan(Math.min(90, 100 / os.cpus().length) * 0.5);
  expect(busy.cpu_pct).toBeLessThanOrEqual(100);
  expect(Date.parse(busy.sampled_at)).toBeGreaterThan(Date.parse(first.sampled_at));

  expect(await load.sample()).toEqual(busy);
});
