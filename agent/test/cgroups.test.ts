/**
 * The cgroups of tenant code on this machine: what a stopped agent's builds left behind is
 * removed, what is in use or just made is not; the agent's processes make way for the cgroups it
 * makes on cgroup v2. Skipped, saying why, where no such hierarchy is writable here.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { AGENT_LEAF, createPidsCgroup, createSocketCgroup, inCgroups, moveIntoLeaf, probeCgroup, probeSocketCgroup, removeCgroup, removeIdleCgroups } from "../src/cgroups.ts";

const pids = await probeCgroup("pids");
const v2 = await probeSocketCgroup();

describe.skipIf(!pids.ok)(`removeIdleCgroups${pids.ok ? "" : ` (skipped: ${pids.reason})`}`, () => {
  it("removes the idle build cgroups older than the age given, and leaves one a process is in", async () => {
    const parent = pids.ok ? pids.cgroup : null;
    const tag = `${process.pid}-${Date.now()}`;
    const idle = await createPidsCgroup(parent!, `build-${tag}-idle`, 8);
    const busy = await createPidsCgroup(parent!, `build-${tag}-busy`, 8);
    const replica = await createPidsCgroup(parent!, `replica-${tag}`, 8);
    const argv = inCgroups([busy], ["sleep", "30"]);
    const child = spawn(argv[0]!, argv.slice(1), { stdio: "ignore" });
    try {
      await new Promise((r) => setTimeout(r, 300));
      // Too young: may be another agent's, about to be joined.
      expect(await removeIdleCgroups(parent!, `build-${tag}-`, 60_000)).toBe(0);
      expect(existsSync(idle)).toBe(true);
      // (This test's own only: other tests' builds may be running beside it.)
      expect(await removeIdleCgroups(parent!, `build-${tag}-`, 0)).toBe(1);
      expect(existsSync(idle)).toBe(false);
      expect(existsSync(busy)).toBe(true);
      expect(existsSync(replica)).toBe(true);
    } finally {
      child.kill("SIGKILL");
      await new Promise((r) => child.once("exit", r));
      await removeCgroup(busy);
      await removeCgroup(replica);
    }
  });
});

describe.skipIf(!v2.ok)(`moveIntoLeaf${v2.ok ? "" : ` (skipped: ${v2.reason})`}`, () => {
  it("moves every process of a cgroup v2 into its leaf, which v2 wants before the cgroup gives its children controllers", async () => {
    const parent = v2.ok ? v2.cgroup : null;
    // Stands in for the cgroup of a systemd service or a container, the agent in it.
    const service = await createSocketCgroup(parent!, `leaf-test-${process.pid}-${Date.now()}`);
    const argv = inCgroups([service], ["sleep", "30"]);
    const children = [spawn(argv[0]!, argv.slice(1), { stdio: "ignore" }), spawn(argv[0]!, argv.slice(1), { stdio: "ignore" })];
    const cgroupOf = async (pid: number) => (await readFile(`/proc/${pid}/cgroup`, "utf8")).split("\n").find((l) => l.startsWith("0::"))?.slice(3);
    try {
      await expect.poll(async () => (await readFile(path.join(service, "cgroup.procs"), "utf8")).trim().split("\n").length).toBe(2);
      await moveIntoLeaf(service);
      expect((await readFile(path.join(service, "cgroup.procs"), "utf8")).trim()).toBe("");
      for (const child of children) expect(await cgroupOf(child.pid!)).toMatch(new RegExp(`/${path.basename(service)}/${AGENT_LEAF}$`));
      // Again (another probe got there first): nothing left to move, no failure.
      await moveIntoLeaf(service);
      // An agent moved into its leaf still makes its cgroups where it was started: beside the leaf.
      const probe = `import { probeSocketCgroup } from ${JSON.stringify(path.resolve(import.meta.dirname, "../src/cgroups.ts"))};
        process.stdin.once("data", async () => { const p = await probeSocketCgroup(); console.log(p.ok ? p.cgroup.dir : p.reason); process.exit(0); });`;
      const agentArgv = inCgroups([service], [process.execPath, "--input-type=module", "-e", probe]);
      const agent = spawn(agentArgv[0]!, agentArgv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
      let said = "";
      agent.stdout!.on("data", (d: Buffer) => (said += String(d)));
      await expect.poll(async () => (await readFile(path.join(service, "cgroup.procs"), "utf8")).trim()).toBe(String(agent.pid));
      await moveIntoLeaf(service);
      expect(await cgroupOf(agent.pid!)).toMatch(new RegExp(`/${AGENT_LEAF}$`));
      agent.stdin!.end("go\n");
      await new Promise((r) => agent.once("exit", r));
      expect(said.trim()).toBe(service);
    } finally {
      for (const child of children) child.kill("SIGKILL");
      await Promise.all(children.map((child) => new Promise((r) => child.once("exit", r))));
      await removeCgroup(path.join(service, AGENT_LEAF));
      await removeCgroup(service);
    }
  });
});
