/**
 * What a stopped agent left in its work directory (agent/src/work-dir.ts): cleared when the next
 * agent starts, the build commands still running in a workspace included.
 */
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { clearAbandonedWork } from "../src/work-dir.ts";

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

let root = "";
afterEach(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

describe("clearAbandonedWork", () => {
  it("kills the commands running in build workspaces and removes the workspaces and preflight clones, nothing else", async () => {
    root = await mkdtemp(path.join(os.tmpdir(), "work-dir-"));
    const src = path.join(root, "build-1234abcd-x", "src");
    await mkdir(src, { recursive: true });
    await mkdir(path.join(root, "preflight", "clone-y"), { recursive: true });
    await mkdir(path.join(root, "images", "web"), { recursive: true });
    await writeFile(path.join(root, "images", "web", "main-1.tar.gz"), "image");
    // As the builder runs a command: its own process group, detached, so it outlived its agent.
    const build = spawn("sh", ["-c", "sleep 60 & sleep 60"], { cwd: src, detached: true, stdio: "ignore" });
    const outside = spawn("sleep", ["60"], { cwd: root, detached: true, stdio: "ignore" });
    try {
      await new Promise((r) => setTimeout(r, 200));
      const cleared = await clearAbandonedWork(root);
      expect(cleared.workspaces).toBe(2);
      expect(cleared.processes).toBeGreaterThanOrEqual(2);
      await expect.poll(() => alive(build.pid!), { timeout: 5_000 }).toBe(false);
      expect(alive(outside.pid!)).toBe(true);
      expect((await readdir(root)).sort()).toEqual(["images", "preflight"]);
      expect(await readdir(path.join(root, "preflight"))).toEqual([]);
      expect(await readdir(path.join(root, "images", "web"))).toEqual(["main-1.tar.gz"]);
    } finally {
      for (const child of [build, outside]) {
        try {
          process.kill(-child.pid!, "SIGKILL");
        } catch {
          // Already gone.
        }
      }
    }
  });

  it("does nothing where there is no work directory yet", async () => {
    expect(await clearAbandonedWork(path.join(os.tmpdir(), "no-such-work-dir-here"))).toEqual({ workspaces: 0, processes: 0 });
  });
});
