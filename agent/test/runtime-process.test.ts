/**
 * The `process` runtime driver and the supervisor with real replicas: small Node programs run
 * through `sh -c`, sandboxed and memory-limited where this machine allows it (probed once here,
 * the same way the driver probes).
 */
import { afterEach, beforeAll, afterAll, beforeEach, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readFile, rm, rmdir, stat, writeFile } from "node:fs/promises";
import net, { type AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { ProcessDriver, probeHttpClient } from "../src/runtime/process.ts";
import { TENANT_CPU_WEIGHT, probeCgroup, probeSocketCgroup } from "../src/cgroups.ts";
import { probeSandbox } from "../src/sandbox.ts";
import type { OutputLine, ReplicaSpec, ReplicaState } from "../src/runtime/types.ts";
import { Supervisor, type CrashLoopEvent, type SupervisorEvent } from "../src/supervisor.ts";

const sandbox = await probeSandbox();
const memory = await probeCgroup("memory");
const pids = await probeCgroup("pids");
const cpu = await probeCgroup("cpu");
const sockets = await probeSocketCgroup();
const noSandbox = sandbox.ok ? "" : ` (skipped: ${sandbox.reason})`;
const noMemory = memory.ok ? "" : ` (skipped: ${memory.reason})`;

let root: string;
let runDir: string;
let releaseDir: string;
let drivers: ProcessDriver[] = [];
let supervisors: Supervisor[] = [];
let seq = 0;

beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "agent-runtime-process-"));
});

afterAll(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

beforeEach(async () => {
  runDir = path.join(root, `run-${seq}`);
  releaseDir = path.join(root, `release-${seq}`);
  await mkdir(releaseDir, { recursive: true });
});

/** Whatever a test left running is stopped and removed by a fresh driver, which adopts it all. */
afterEach(async () => {
  for (const s of supervisors) await s.close();
  for (const d of drivers) await d.close();
  supervisors = [];
  drivers = [];
  const cleaner = new ProcessDriver({ runDir });
  for (const r of await cleaner.adopt()) {
    await cleaner.stop(r.spec.id, 500);
    await cleaner.remove(r.spec.id);
  }
  await cleaner.close();
});

/** Replicas run as the agent runs them: sandboxed (where this machine can) as the tenant user. */
const TENANT = { uid: 61000, gid: 61000 };

function newDriver(opts: { sandbox?: "auto" | "off" } = {}): ProcessDriver {
  const driver = new ProcessDriver({ runDir, runAs: TENANT, ...opts });
  drivers.push(driver);
  return driver;
}

function makeSpec(command: string, over: Partial<ReplicaSpec> = {}): ReplicaSpec {
  const index = seq++;
  return {
    id: `g.app.main.web.blue.${index}`,
    group: "g",
    app: "app",
    branch: "main",
    service: "web",
    colour: "blue",
    index,
    tag: "main-abc123",
    releaseDir,
    command,
    env: {},
    port: null,
    memoryMb: null,
    ...over,
  };
}

/** `node -e <script>`, quoted for sh; the driver puts this Node first on the replica's PATH. */
function nodeCommand(script: string): string {
  return `node -e '${script.replaceAll("'", `'\\''`)}'`;
}

const HTTP_SERVER = `
  const http = require("node:http");
  http.createServer((req, res) => {
    if (req.url === "/exit") { res.end("bye"); setTimeout(() => process.exit(5), 20); return; }
    res.end("hello from " + process.env.PORT);
  }).listen(Number(process.env.PORT), "127.0.0.1", () => console.log("listening"));
`;

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

async function until<T>(check: () => T | Promise<T>, what: string, timeoutMs = 15_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function get(port: number, pathname = "/"): Promise<string> {
  return until(
    () =>
      fetch(`http://127.0.0.1:${port}${pathname}`).then(
        (res) => res.text(),
        () => null,
      ),
    `HTTP on port ${port}`,
  );
}

/**
 * No process of the group is left. Zombies do not count: this container's init does not reap the
 * orphans a killed `sh` or `bwrap` leaves behind.
 */
function groupGone(pgid: number): boolean {
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue;
    }
    const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(pgrp) === pgid && state !== "Z") return false;
  }
  return true;
}

function exits(driver: ProcessDriver): ReplicaState[] {
  const seen: ReplicaState[] = [];
  driver.onExit((state) => seen.push(state));
  return seen;
}

function output(driver: ProcessDriver): OutputLine[] {
  const seen: OutputLine[] = [];
  driver.onOutput((line) => seen.push(line));
  return seen;
}

describe.each(["auto", "off"] as const)("ProcessDriver with sandbox %s", (mode) => {
  it("runs a replica that answers HTTP on its PORT", async () => {
    const driver = newDriver({ sandbox: mode });
    const port = await freePort();
    const state = await driver.start(makeSpec(nodeCommand(HTTP_SERVER), { port, env: { PORT: String(port) } }));
    expect(state.running).toBe(true);
    expect(Number(state.handle)).toBeGreaterThan(0);
    expect(await get(port)).toBe(`hello from ${port}`);
    expect(driver.list().map((r) => [r.spec.id, r.running])).toEqual([[state.spec.id, true]]);
  });

  it("merges stdout and stderr in order for tail() and reports each line's stream", async () => {
    const driver = newDriver({ sandbox: mode });
    const lines = output(driver);
    const script = `
      let i = 0;
      const t = setInterval(() => {
        const err = i % 2 === 1;
        (err ? process.stderr : process.stdout).write("line " + i + (err ? " err" : " out") + "\\n");
        if (++i === 40) { clearInterval(t); setInterval(() => {}, 1000); }
      }, 40);
    `;
    const spec = makeSpec(nodeCommand(script));
    await driver.start(spec);
    await until(() => lines.length >= 40, "40 lines of output");
    const expected = Array.from({ length: 40 }, (_, i) => `line ${i} ${i % 2 ? "err" : "out"}`);
    expect(lines.map((l) => l.line)).toEqual(expected);
    for (const l of lines) {
      expect(l.replicaId).toBe(spec.id);
      expect(l.stream).toBe(l.line.endsWith("err") ? "stderr" : "stdout");
    }
    expect(await driver.tail(spec.id, 30)).toEqual(expected.slice(10));
    expect(await driver.tail(spec.id)).toEqual(expected.slice(10));
    expect(await driver.tail(spec.id, 3)).toEqual(expected.slice(37));
  });

  it("reports a crash through onExit with its exit code, and tail() shows its last output", async () => {
    const driver = newDriver({ sandbox: mode });
    const exited = exits(driver);
    const spec = makeSpec(nodeCommand(`setTimeout(() => { console.log("starting"); console.error("fatal: boom"); process.exit(3); }, 300);`));
    await driver.start(spec);
    const state = await until(() => exited[0], "the exit");
    expect(state.spec.id).toBe(spec.id);
    expect(state.running).toBe(false);
    expect(state.exit).toMatchObject({ code: 3, signal: null, oomKilled: false });
    expect(await driver.tail(spec.id)).toEqual(["starting", "fatal: boom"]);
    expect(driver.list()[0]?.running).toBe(false);
    expect(exited).toHaveLength(1);
  });

  it("reports a command that dies leaving children behind at once, and stops them with it", async () => {
    const driver = newDriver({ sandbox: mode });
    const exited = exits(driver);
    // The command's child would sleep for minutes: the replica is over when the command is.
    const spec = makeSpec(`sleep 300 & echo "child $!"; sleep 0.3; exit 5`);
    const state = await driver.start(spec);
    const ended = await until(() => exited[0], "the exit", 10_000);
    expect(ended.exit).toMatchObject({ code: 5, oomKilled: false });
    expect(groupGone(Number(state.handle))).toBe(true);
  });

  it("sees the exit of a command that ends at once, while its start is still being recorded", async () => {
    const driver = newDriver({ sandbox: mode });
    const exited = exits(driver);
    const specs = Array.from({ length: 8 }, () => makeSpec("echo 'no such module' >&2; exit 3"));
    for (const spec of specs) await driver.start(spec);
    await until(() => exited.length === specs.length, `the exit of ${specs.length} replicas`, 5_000);
    expect(exited.map((e) => e.exit?.code)).toEqual(specs.map(() => 3));
    expect(driver.list().filter((r) => r.running)).toEqual([]);
  });

  it("keeps a crash's last stderr line last, after a burst of stdout written before it", async () => {
    const driver = newDriver({ sandbox: mode });
    const exited = exits(driver);
    // The driver starts reading at the first line, while the rest are still being written.
    const burst = `setTimeout(() => { for (let i = 1; i <= 50; i++) console.log("line " + i); console.error("fatal: broke"); process.exit(3); }, 300);`;
    const spec = makeSpec(nodeCommand(burst));
    await driver.start(spec);
    await until(() => exited[0], "the exit");
    const tail = await driver.tail(spec.id, 30);
    expect(tail.at(-1)).toBe("fatal: broke");
    expect(tail.slice(0, -1)).toEqual(Array.from({ length: 29 }, (_, i) => `line ${i + 22}`));
  });

  it("stops gracefully: the SIGTERM handler runs, and onExit is not called", async () => {
    const driver = newDriver({ sandbox: mode });
    const exited = exits(driver);
    const lines = output(driver);
    const script = `
      process.on("SIGTERM", () => { console.log("got SIGTERM"); setTimeout(() => { console.log("bye"); process.exit(0); }, 300); });
      console.log("ready");
      setInterval(() => {}, 1000);
    `;
    const spec = makeSpec(nodeCommand(script));
    const { handle } = await driver.start(spec);
    await until(() => lines.some((l) => l.line === "ready"), "ready");
    const began = Date.now();
    await driver.stop(spec.id, 10_000);
    expect(Date.now() - began).toBeLessThan(5_000);
    expect(groupGone(Number(handle))).toBe(true);
    expect(await driver.tail(spec.id)).toEqual(["ready", "got SIGTERM", "bye"]);
    expect(driver.list()[0]?.running).toBe(false);
    await driver.stop(spec.id, 10_000);
    expect(exited).toEqual([]);
  });

  it("kills a replica that ignores SIGTERM once the grace period is over", async () => {
    const driver = newDriver({ sandbox: mode });
    const exited = exits(driver);
    const lines = output(driver);
    const script = `
      process.on("SIGTERM", () => console.log("ignoring SIGTERM"));
      console.log("ready");
      setInterval(() => {}, 1000);
    `;
    const spec = makeSpec(nodeCommand(script));
    const { handle } = await driver.start(spec);
    await until(() => lines.some((l) => l.line === "ready"), "ready");
    const began = Date.now();
    await Promise.all([driver.stop(spec.id, 800), driver.stop(spec.id, 800)]);
    expect(Date.now() - began).toBeGreaterThanOrEqual(700);
    expect(groupGone(Number(handle))).toBe(true);
    expect(await driver.tail(spec.id)).toEqual(["ready", "ignoring SIGTERM"]);
    expect(driver.list()[0]?.running).toBe(false);
    expect(exited).toEqual([]);
  });
});

describe("the HTTP client a replica can run", () => {
  it("is the first of curl, python3, node found executable on its PATH, or none", async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), "agent-probe-"));
    try {
      const bin = async (dir: string, name: string, mode = 0o755) => {
        await mkdir(path.join(root, dir), { recursive: true });
        await writeFile(path.join(root, dir, name), "#!/bin/sh\n");
        await chmod(path.join(root, dir, name), mode);
      };
      await bin("a", "node");
      await bin("b", "python3");
      await bin("c", "curl", 0o644);
      const at = (...dirs: string[]) => dirs.map((d) => path.join(root, d)).join(":");
      expect(await probeHttpClient(at("a", "b"))).toBe("python3");
      expect(await probeHttpClient(at("a"))).toBe("node");
      // Not executable: not runnable. A relative PATH entry is not looked in.
      expect(await probeHttpClient(at("c"))).toBe("none");
      expect(await probeHttpClient(`relative:${at("c")}`)).toBe("none");
      await chmod(path.join(root, "c", "curl"), 0o755);
      expect(await probeHttpClient(at("a", "b", "c"))).toBe("curl");
      expect(await probeHttpClient("")).toBe("none");
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  it("is probed when a replica starts, from the PATH it runs with", async () => {
    const driver = newDriver({ sandbox: "off" });
    const state = await driver.start(makeSpec(nodeCommand("setInterval(() => {}, 1000)"), { env: { PATH: path.dirname(process.execPath) } }));
    expect(state.capability).toMatchObject({ httpClient: "node" });
    expect(driver.list()[0]!.capability!.probedAt).toBeInstanceOf(Date);
  });
});

describe("ProcessDriver output files", () => {
  it("empties the stream files once read and rotates output.log at 10 MiB, losing no line", async () => {
    const driver = newDriver();
    const lines = output(driver);
    const script = `
      const pad = "x".repeat(1000);
      for (let i = 0; i < 11500; i++) process.stdout.write(i + " " + pad + "\\n");
      console.log("done");
      setInterval(() => {}, 1000);
    `;
    const spec = makeSpec(nodeCommand(script));
    await driver.start(spec);
    await until(() => lines.some((l) => l.line === "done"), "all the output", 30_000);
    expect(lines).toHaveLength(11501);
    expect(lines.slice(0, 11500).every((l, i) => l.line.startsWith(`${i} x`))).toBe(true);
    const dir = path.join(runDir, "replicas", spec.id);
    await until(async () => (await stat(path.join(dir, "stdout.log"))).size === 0, "stdout.log emptied");
    expect((await stat(path.join(dir, "output.log"))).size).toBeLessThanOrEqual(10 * 1024 * 1024);
    expect(existsSync(path.join(dir, "output.log.1"))).toBe(true);
    const tail = await driver.tail(spec.id, 3);
    expect(tail[2]).toBe("done");
    expect(tail.slice(0, 2).map((l) => l.split(" ")[0])).toEqual(["11498", "11499"]);
  });
});

describe("ProcessDriver after an agent restart", () => {
  it("adopts running replicas: output keeps flowing without gaps, exits are seen, stop works", async () => {
    const ticking = `setInterval(() => console.log("tick " + (globalThis.n = (globalThis.n ?? 0) + 1)), 100);` + HTTP_SERVER;
    const first = newDriver();
    const firstLines = output(first);
    const ports = [await freePort(), await freePort()];
    const specs = ports.map((port) => makeSpec(nodeCommand(ticking), { port, env: { PORT: String(port) } }));
    const started = [];
    for (const spec of specs) started.push(await first.start(spec));
    const ticksOf = (lines: OutputLine[], id: string) => lines.filter((l) => l.replicaId === id && l.line.startsWith("tick")).map((l) => Number(l.line.slice(5)));
    await until(() => specs.every((s) => ticksOf(firstLines, s.id).length >= 3), "ticks before the restart");
    await first.close();
    // The agent is away for a while: the replicas keep writing.
    await new Promise((resolve) => setTimeout(resolve, 500));

    const second = newDriver();
    const secondLines = output(second);
    const exited = exits(second);
    const adopted = await second.adopt();
    expect(adopted.map((r) => [r.spec.id, r.handle, r.running]).sort()).toEqual(started.map((r) => [r.spec.id, r.handle, true]).sort());
    for (const spec of specs) {
      await until(() => ticksOf(secondLines, spec.id).length >= 8, "ticks after the restart");
      const before = ticksOf(firstLines, spec.id);
      const after = ticksOf(secondLines, spec.id);
      // Every tick exactly once, across both agents.
      expect([...before, ...after]).toEqual(Array.from({ length: before.length + after.length }, (_, i) => i + 1));
      expect(await get(spec.port!)).toBe(`hello from ${spec.port}`);
    }

    const [crashing, stopping] = specs as [ReplicaSpec, ReplicaSpec];
    expect(await get(crashing.port!, "/exit")).toBe("bye");
    const exit = await until(() => exited.find((s) => s.spec.id === crashing.id), "the adopted replica's exit");
    expect(exit.running).toBe(false);
    expect(exit.exit).toMatchObject({ code: null, oomKilled: false });

    await second.stop(stopping.id, 2_000);
    expect(groupGone(Number(adopted.find((r) => r.spec.id === stopping.id)!.handle))).toBe(true);
    expect(second.list().every((r) => !r.running)).toBe(true);
    expect(exited.map((s) => s.spec.id)).toEqual([crashing.id]);

    const third = newDriver();
    expect((await third.adopt()).map((r) => r.running)).toEqual([false, false]);
  });

  it("does not take a process that reused a recorded pid for the replica", async () => {
    const spec = makeSpec("true");
    const dir = path.join(runDir, "replicas", spec.id);
    await mkdir(dir, { recursive: true });
    const record = { spec, pid: process.pid, startedAt: new Date().toISOString(), procStart: "1", cgroup: null, oomBase: 0, sandboxed: false };
    await writeFile(path.join(dir, "replica.json"), JSON.stringify(record));
    const driver = newDriver();
    const [adopted] = await driver.adopt();
    expect(adopted).toMatchObject({ running: false, exit: { code: null, oomKilled: false } });
  });
});

/** A replica that starts `n` processes at once, then says how many started and how many were refused. */
const forking = (n: number) => `
  const { spawn } = require("node:child_process");
  let started = 0, refused = 0;
  for (let i = 0; i < ${n}; i++) {
    const child = spawn("sleep", ["30"], { stdio: "ignore" });
    child.on("spawn", () => started++);
    child.on("error", () => refused++);
  }
  setTimeout(() => console.log("started " + started + " refused " + refused), 2000);
  setInterval(() => undefined, 1000);
`;

describe("ProcessDriver limits", () => {
  it.skipIf(!memory.ok)(`OOM-kills a replica beyond its 64 MiB cgroup limit and reports oomKilled${noMemory}`, async () => {
    const driver = newDriver();
    const exited = exits(driver);
    const lines = output(driver);
    const script = `
      const keep = [];
      console.log("allocating");
      setInterval(() => { keep.push(Buffer.alloc(16 * 1024 * 1024, 1)); console.log("holding " + keep.length * 16 + " MiB"); }, 50);
    `;
    const spec = makeSpec(nodeCommand(script), { memoryMb: 64 });
    await driver.start(spec);
    const record = JSON.parse(await readFile(path.join(runDir, "replicas", spec.id, "replica.json"), "utf8")) as { cgroup: string };
    expect(record.cgroup).toBeTruthy();
    const limitFile = existsSync(path.join(record.cgroup, "memory.max")) ? "memory.max" : "memory.limit_in_bytes";
    expect((await readFile(path.join(record.cgroup, limitFile), "utf8")).trim()).toBe(String(64 * 1024 * 1024));
    const state = await until(() => exited[0], "the OOM kill", 30_000);
    expect(state.exit?.oomKilled).toBe(true);
    expect(lines.some((l) => l.line === "allocating")).toBe(true);
    expect(lines.some((l) => l.line === "holding 256 MiB")).toBe(false);
    await driver.remove(spec.id);
    expect(existsSync(record.cgroup)).toBe(false);
    expect(existsSync(path.join(runDir, "replicas", spec.id))).toBe(false);
  });

  it.skipIf(!pids.ok)(`holds a replica to its processes and threads: forks past the limit fail, the host's do not${pids.ok ? "" : ` (skipped: ${pids.reason})`}`, async () => {
    const driver = new ProcessDriver({ runDir, runAs: TENANT, pidsMax: 48 });
    drivers.push(driver);
    const lines = output(driver);
    const script = forking(80);
    const spec = makeSpec(nodeCommand(script));
    await driver.start(spec);
    const record = JSON.parse(await readFile(path.join(runDir, "replicas", spec.id, "replica.json"), "utf8")) as { pidsCgroup: string };
    expect((await readFile(path.join(record.pidsCgroup, "pids.max"), "utf8")).trim()).toBe("48");
    const said = await until(() => lines.find((l) => l.line.startsWith("started ")), "the replica's count", 15_000);
    const [, started, refused] = /^started (\d+) refused (\d+)$/.exec(said.line)!.map(Number);
    expect(started).toBeGreaterThan(0);
    expect(started).toBeLessThan(48);
    expect(refused).toBeGreaterThan(0);
    expect(Number((await readFile(path.join(record.pidsCgroup, "pids.current"), "utf8")).trim())).toBeLessThanOrEqual(48);
    // The host forks as before.
    expect(spawnSync("true").status).toBe(0);
    await driver.remove(spec.id);
    expect(existsSync(record.pidsCgroup)).toBe(false);
  });

  it.skipIf(!pids.ok || !memory.ok)(`holds all replicas together to the tenants' share: past it their forks fail, though each is within its own limit${pids.ok ? noMemory : ` (skipped: ${pids.reason})`}`, async () => {
    // A share of the test's own: the host's tenants' cgroup is the live platform's.
    const tenants = { name: `tenants-test-${process.pid}`, memoryMb: 200, pidsMax: 40 };
    const driver = new ProcessDriver({ runDir, runAs: TENANT, pidsMax: 1024, tenants });
    drivers.push(driver);
    const lines = output(driver);
    const script = forking(30);
    const specs = [makeSpec(nodeCommand(script), { memoryMb: 128 }), makeSpec(nodeCommand(script), { memoryMb: 128 })];
    for (const spec of specs) await driver.start(spec);
    const records = await Promise.all(specs.map(async (spec) => JSON.parse(await readFile(path.join(runDir, "replicas", spec.id, "replica.json"), "utf8")) as { cgroup: string; pidsCgroup: string }));
    const share = { pids: path.dirname(records[0]!.pidsCgroup), memory: path.dirname(records[0]!.cgroup) };
    try {
      for (const r of records) expect([path.dirname(r.pidsCgroup), path.dirname(r.cgroup)]).toEqual([share.pids, share.memory]);
      expect(path.basename(share.pids)).toBe(`platform-${tenants.name}`);
      expect((await readFile(path.join(share.pids, "pids.max"), "utf8")).trim()).toBe("40");
      const limitFile = existsSync(path.join(share.memory, "memory.max")) ? "memory.max" : "memory.limit_in_bytes";
      expect((await readFile(path.join(share.memory, limitFile), "utf8")).trim()).toBe(String(200 * 1024 * 1024));
      const counts = await until(() => {
        const said = lines.filter((l) => l.line.startsWith("started "));
        return said.length === 2 ? said.map((l) => /^started (\d+) refused (\d+)$/.exec(l.line)!.slice(1).map(Number)) : null;
      }, "both replicas' counts", 15_000);
      // 2 x 30 forks asked for, 40 processes and threads allowed together (each node has threads of its own).
      expect(counts.reduce((n, [started]) => n + started!, 0)).toBeLessThan(40);
      expect(counts.reduce((n, [, refused]) => n + refused!, 0)).toBeGreaterThan(20);
      expect(Number((await readFile(path.join(share.pids, "pids.current"), "utf8")).trim())).toBeLessThanOrEqual(40);
      expect(spawnSync("true").status).toBe(0);
    } finally {
      for (const spec of specs) await driver.remove(spec.id);
      for (const dir of new Set([share.pids, share.memory])) await rmdir(dir).catch(() => undefined);
    }
  });

  it.skipIf(!memory.ok || !sandbox.ok)(`shows a sandboxed replica its own cgroups, read-only, and none of another replica's${noMemory || noSandbox}`, async () => {
    const driver = newDriver();
    const lines = output(driver);
    const other = makeSpec(nodeCommand("setInterval(() => undefined, 1000)"), { memoryMb: 96 });
    await driver.start(other);
    const otherCgroup = (JSON.parse(await readFile(path.join(runDir, "replicas", other.id, "replica.json"), "utf8")) as { cgroup: string }).cgroup;
    const script = `
      const fs = require("node:fs");
      const attempt = (f) => { try { return String(f()); } catch (e) { return e.code; } };
      const own = /^\\d+:memory:(.*)$/m.exec(fs.readFileSync("/proc/self/cgroup", "utf8"))?.[1]
        ?? /^0::(.*)$/m.exec(fs.readFileSync("/proc/self/cgroup", "utf8"))[1];
      const dir = fs.existsSync("/sys/fs/cgroup/memory") ? "/sys/fs/cgroup/memory" + own : "/sys/fs/cgroup" + own;
      const limit = fs.existsSync(dir + "/memory.max") ? dir + "/memory.max" : dir + "/memory.limit_in_bytes";
      console.log(JSON.stringify({
        constrained: process.constrainedMemory(),
        siblings: fs.readdirSync(require("node:path").dirname(dir)),
        other: fs.existsSync(${JSON.stringify(otherCgroup)}),
        write: attempt(() => fs.writeFileSync(limit, "max")),
      }));
      setInterval(() => undefined, 1000);
    `;
    const spec = makeSpec(nodeCommand(script), { memoryMb: 64 });
    await driver.start(spec);
    const cgroup = (JSON.parse(await readFile(path.join(runDir, "replicas", spec.id, "replica.json"), "utf8")) as { cgroup: string }).cgroup;
    const said = JSON.parse((await until(() => lines.find((l) => l.line.startsWith("{")), "the replica's view", 15_000)).line);
    expect(said).toEqual({ constrained: 64 * 1024 * 1024, siblings: [path.basename(cgroup)], other: false, write: "EROFS" });
    expect(existsSync(otherCgroup)).toBe(true);
  });

  it.skipIf(!cpu.ok)(`weighs a replica's processes together on the CPU, at a tenant's weight, and removes the cgroup with it${cpu.ok ? "" : ` (skipped: ${cpu.reason})`}`, async () => {
    const driver = newDriver();
    const lines = output(driver);
    // Two busy children and the replica itself: all in the one cgroup.
    const script = `
      const { spawn } = require("node:child_process");
      for (let i = 0; i < 2; i++) spawn("sh", ["-c", "while :; do :; done"], { stdio: "ignore" });
      console.log("spinning");
      setInterval(() => undefined, 1000);
    `;
    const spec = makeSpec(nodeCommand(script));
    await driver.start(spec);
    const record = JSON.parse(await readFile(path.join(runDir, "replicas", spec.id, "replica.json"), "utf8")) as { cpuCgroup: string };
    await until(() => lines.find((l) => l.line === "spinning"), "the replica's children", 15_000);
    const [file, value] = TENANT_CPU_WEIGHT[cpu.ok ? cpu.cgroup.version : 2];
    expect((await readFile(path.join(record.cpuCgroup, file), "utf8")).trim()).toBe(value);
    const members = (await readFile(path.join(record.cpuCgroup, "cgroup.procs"), "utf8")).split("\n").filter(Boolean);
    expect(members.length).toBeGreaterThanOrEqual(3);
    await driver.remove(spec.id);
    expect(existsSync(record.cpuCgroup)).toBe(false);
  });

  it.skipIf(!sockets.ok)(`runs a replica with a port in a cgroup v2 of its own, named to the fence before it starts, and removes it with the replica${sockets.ok ? "" : ` (skipped: ${sockets.reason})`}`, async () => {
    const named: Array<{ cgroup: string; port: number }> = [];
    const driver = new ProcessDriver({ runDir, runAs: TENANT, ownPort: (cgroup, port) => named.push({ cgroup, port }) });
    drivers.push(driver);
    const port = await freePort();
    const spec = makeSpec(nodeCommand(HTTP_SERVER), { port, env: { PORT: String(port) } });
    const state = await driver.start(spec);
    expect(named).toEqual([{ cgroup: state.socketCgroup, port }]);
    expect(await get(port)).toBe(`hello from ${port}`);
    // The kernel marks the replica's sockets with this cgroup: its processes are in it.
    const procs = (await readFile(path.join(state.socketCgroup!, "cgroup.procs"), "utf8")).trim().split("\n").map(Number);
    expect(procs).toContain(Number(state.handle));
    // A background service (no port) needs none.
    const worker = await driver.start(makeSpec(nodeCommand("setInterval(() => undefined, 1000)")));
    expect(worker.socketCgroup).toBeUndefined();
    expect(named).toHaveLength(1);
    await driver.remove(spec.id);
    expect(existsSync(state.socketCgroup!)).toBe(false);
  });

  it.skipIf(!sandbox.ok)(`sandboxes a replica: only its release dir, HOME and a private /tmp are writable, the network is shared${noSandbox}`, async () => {
    const driver = newDriver({ sandbox: "auto" });
    const port = await freePort();
    const escape = path.join(runDir, "escape");
    const script = `
      const fs = require("node:fs");
      const http = require("node:http");
      const attempt = (file) => { try { fs.writeFileSync(file, "x"); return "ok"; } catch (e) { return e.code; } };
      const result = {
        usr: attempt("/usr/platform-sandbox-probe"),
        release: attempt("release-file"),
        home: attempt(process.env.HOME + "/home-file"),
        tmp: attempt("/tmp/platform-sandbox-probe"),
        outside: attempt(${JSON.stringify(escape)}),
        uid: process.getuid(),
      };
      http.createServer((req, res) => res.end(JSON.stringify(result))).listen(Number(process.env.PORT), "127.0.0.1");
    `;
    const spec = makeSpec(nodeCommand(script), { port, env: { PORT: String(port) } });
    await driver.start(spec);
    const result = JSON.parse(await get(port)) as Record<string, string>;
    expect(result).toMatchObject({ usr: expect.stringMatching(/^(EROFS|EACCES)$/), release: "ok", home: "ok", tmp: "ok", uid: TENANT.uid });
    expect(existsSync("/usr/platform-sandbox-probe")).toBe(false);
    expect(existsSync("/tmp/platform-sandbox-probe")).toBe(false);
    // Under /tmp the write lands in the sandbox's own tmpfs, elsewhere it is refused: never on the host.
    expect(existsSync(escape)).toBe(false);
    expect(existsSync(path.join(releaseDir, "release-file"))).toBe(true);
    expect(existsSync(path.join(runDir, "replicas", spec.id, "home", "home-file"))).toBe(true);
  });

  it.skipIf(!sandbox.ok)(`hides the agent's files and secrets from a replica: the run directory and the paths it is told to hide${noSandbox}`, async () => {
    // Outside /tmp, which the sandbox replaces with its own tmpfs anyway.
    const base = await mkdtemp(path.join("/var/tmp", "platform-hide-"));
    const secrets = path.join(base, "secrets");
    const ownRunDir = path.join(base, "run");
    await mkdir(secrets, { recursive: true });
    await mkdir(ownRunDir, { recursive: true });
    await writeFile(path.join(secrets, "root-key"), "pf_k1_secret");
    await writeFile(path.join(ownRunDir, "state.json.probe"), "another app's state");
    const driver = new ProcessDriver({ runDir: ownRunDir, hide: [secrets], runAs: TENANT });
    drivers.push(driver);
    const port = await freePort();
    const script = `
      const fs = require("node:fs");
      const http = require("node:http");
      const read = (file) => { try { return fs.readFileSync(file, "utf8"); } catch (e) { return e.code; } };
      const result = { secret: read(${JSON.stringify(path.join(secrets, "root-key"))}), state: read(${JSON.stringify(path.join(ownRunDir, "state.json.probe"))}), own: read("own-file"), home: fs.existsSync(process.env.HOME) };
      http.createServer((req, res) => res.end(JSON.stringify(result))).listen(Number(process.env.PORT), "127.0.0.1");
    `;
    await writeFile(path.join(releaseDir, "own-file"), "mine");
    const spec = makeSpec(nodeCommand(script), { port, env: { PORT: String(port) } });
    await driver.start(spec);
    try {
      expect(JSON.parse(await get(port))).toEqual({ secret: "ENOENT", state: "ENOENT", own: "mine", home: true });
    } finally {
      // Its own run directory, which the cleaner after each test does not look in.
      await driver.stop(spec.id, 1000);
      await driver.remove(spec.id);
      await rm(base, { recursive: true, force: true });
    }
  });
});

describe("Supervisor", () => {
  it("restarts a desired replica that crashed (crashed, then restarted) and leaves released ones down", async () => {
    const driver = newDriver();
    const events: SupervisorEvent[] = [];
    const supervisor = new Supervisor({ driver, onEvent: (e) => events.push(e) });
    supervisors.push(supervisor);
    const driverExits = exits(driver);

    const port = await freePort();
    const crashOnce = `
      const fs = require("node:fs");
      if (!fs.existsSync(process.env.MARKER)) {
        fs.writeFileSync(process.env.MARKER, "");
        setTimeout(() => { console.error("crashing on purpose"); process.exit(2); }, 300);
      } else {
        ${HTTP_SERVER}
      }
    `;
    const desired = makeSpec(nodeCommand(crashOnce), { port, env: { PORT: String(port), MARKER: path.join(releaseDir, "crashed-once") } });
    const released = makeSpec(nodeCommand(`setTimeout(() => process.exit(4), 300);`));
    const first = await driver.start(desired);
    supervisor.desire(desired);
    await driver.start(released);
    supervisor.desire(released);
    supervisor.release(released.id);
    expect(supervisor.desired().map((s) => s.id)).toEqual([desired.id]);

    await until(() => events.some((e) => e.kind === "restarted"), "the restart");
    expect(events.map((e) => [e.replicaId, e.kind])).toEqual([
      [desired.id, "crashed"],
      [desired.id, "restarted"],
    ]);
    expect(events[0]).toMatchObject({ app: "app", branch: "main", group: "g", service: "web", exit: { code: 2, oomKilled: false } });
    expect(await get(port)).toBe(`hello from ${port}`);
    const now = driver.list().find((r) => r.spec.id === desired.id)!;
    expect(now.running).toBe(true);
    expect(now.handle).not.toBe(first.handle);

    await until(() => driverExits.some((s) => s.spec.id === released.id), "the released replica's exit");
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(events.filter((e) => e.replicaId === released.id)).toEqual([]);
    expect(driver.list().find((r) => r.spec.id === released.id)?.running).toBe(false);

    supervisor.release(desired.id);
    await driver.stop(desired.id, 2_000);
    expect(events).toHaveLength(2);
  });

  it("says an adopted replica's exit status is unknown rather than that it exited, as a clean exit would read", async () => {
    const port = await freePort();
    const spec = makeSpec(nodeCommand(HTTP_SERVER), { port, env: { PORT: String(port) } });
    const first = newDriver();
    await first.start(spec);
    await first.close();
    const driver = newDriver();
    await driver.adopt();
    const events: SupervisorEvent[] = [];
    const supervisor = new Supervisor({ driver, onEvent: (e) => events.push(e) });
    supervisors.push(supervisor);
    supervisor.desire(spec);
    expect(await get(port, "/exit")).toBe("bye");
    const crashed = await until(() => events.find((e) => e.kind === "crashed"), "the adopted replica's crash");
    expect(crashed.message).toMatch(new RegExp(`^Replica ${spec.id} exited \\(exit status unknown\\); restarting`));
    await until(() => events.some((e) => e.kind === "restarted"), "the restart");
    supervisor.release(spec.id);
    await driver.stop(spec.id, 2_000);
  });

  it("starts a replica that had already exited when it is desired (a crash between health check and swap), and logs it", async () => {
    const driver = newDriver();
    const events: SupervisorEvent[] = [];
    const supervisor = new Supervisor({ driver, onEvent: (e) => events.push(e) });
    supervisors.push(supervisor);
    const port = await freePort();
    const crashOnce = `
      const fs = require("node:fs");
      if (!fs.existsSync(process.env.MARKER)) {
        fs.writeFileSync(process.env.MARKER, "");
        process.exit(3);
      } else {
        ${HTTP_SERVER}
      }
    `;
    const spec = makeSpec(nodeCommand(crashOnce), { port, env: { PORT: String(port), MARKER: path.join(releaseDir, "exited-before-desired") } });
    await driver.start(spec);
    await until(() => driver.list().some((r) => r.spec.id === spec.id && !r.running), "the early exit");
    supervisor.desire(spec);
    await until(() => events.some((e) => e.kind === "restarted"), "the restart");
    expect(events.map((e) => [e.replicaId, e.kind])).toEqual([
      [spec.id, "crashed"],
      [spec.id, "restarted"],
    ]);
    expect(await get(port)).toBe(`hello from ${port}`);
    supervisor.release(spec.id);
    await driver.stop(spec.id, 2_000);
  });

  it("says a replica is crash-looping at its third crash in a row, and that it stopped once a restart runs stably, or once it is released", async () => {
    const driver = newDriver();
    const loops: CrashLoopEvent[] = [];
    const events: SupervisorEvent[] = [];
    const supervisor = new Supervisor({ driver, onEvent: (e) => events.push(e), onCrashLoop: (e) => loops.push(e), stableRunMs: 1_500 });
    supervisors.push(supervisor);
    const port = await freePort();
    // Dies three times, then serves.
    const crashThrice = `
      const fs = require("node:fs");
      const runs = fs.existsSync(process.env.COUNTER) ? Number(fs.readFileSync(process.env.COUNTER, "utf8")) : 0;
      fs.writeFileSync(process.env.COUNTER, String(runs + 1));
      if (runs < 3) setTimeout(() => process.exit(7), 100);
      else { ${HTTP_SERVER} }
    `;
    const spec = makeSpec(nodeCommand(crashThrice), { port, env: { PORT: String(port), COUNTER: path.join(releaseDir, "crash-thrice") } });
    await driver.start(spec);
    supervisor.desire(spec);
    await until(() => loops.length > 0, "the crash loop", 20_000);
    expect(events.filter((e) => e.kind === "crashed")).toHaveLength(3);
    expect(loops[0]).toMatchObject({ looping: true, crashes: 3, exit: { code: 7 } });
    expect(loops[0]!.spec.id).toBe(spec.id);
    await until(() => loops.length > 1, "the end of the crash loop", 20_000);
    expect(loops[1]).toMatchObject({ looping: false });
    expect(await get(port)).toBe(`hello from ${port}`);
    supervisor.release(spec.id);
    expect(loops).toHaveLength(2);
    await driver.stop(spec.id, 2_000);

    // A replica released while it loops: the loop ends with it.
    const port2 = await freePort();
    const looping = makeSpec(nodeCommand("setTimeout(() => process.exit(7), 100);"), { port: port2, env: { PORT: String(port2) } });
    await driver.start(looping);
    supervisor.desire(looping);
    await until(() => loops.length > 2, "the second crash loop", 20_000);
    supervisor.release(looping.id);
    expect(loops.slice(2).map((e) => [e.spec.id, e.looping])).toEqual([
      [looping.id, true],
      [looping.id, false],
    ]);
    await driver.stop(looping.id, 2_000).catch(() => undefined);
  });
});
