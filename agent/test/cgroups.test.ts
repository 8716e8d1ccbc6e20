/**
 * The cgroups of tenant code on this machine: what a stopped agent's builds left behind is
 * removed, what is in use or just made is not. Skipped, saying why, where no pids hierarchy is
 * writable here.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { createPidsCgroup, inCgroups, probeCgroup, removeCgroup, removeIdleCgroups } from "../src/cgroups.ts";

const pids = await probeCgroup("pids");

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
