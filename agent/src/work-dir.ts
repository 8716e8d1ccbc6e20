/**
 * What an agent stopped in the middle of its work leaves in its work directory: build workspaces
 * (`build-*`) and preflight clones (`preflight/clone-*`), and the build commands still running in
 * a workspace (each runs in a process group of its own, so it outlives the agent). They are
 * cleared when the agent starts, before it takes any work: the build runs again from its
 * redelivered message, and a second copy of it beside the first would only share the machine.
 */
import { readdir, readlink, realpath, rm } from "node:fs/promises";
import path from "node:path";

/** Processes whose working directory is inside one of `dirs` (read from /proc; none where there is no /proc). */
async function processesIn(dirs: string[]): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir("/proc").catch(() => [] as string[])) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid <= 1 || pid === process.pid) continue;
    const cwd = await readlink(`/proc/${pid}/cwd`).catch(() => null);
    if (cwd && dirs.some((dir) => cwd === dir || cwd.startsWith(`${dir}${path.sep}`))) pids.push(pid);
  }
  return pids;
}

export interface ClearedWork {
  workspaces: number;
  processes: number;
}

export async function clearAbandonedWork(dir: string): Promise<ClearedWork> {
  // /proc names working directories by their real path.
  const workDir = await realpath(dir).catch(() => null);
  if (!workDir) return { workspaces: 0, processes: 0 };
  const builds = (await readdir(workDir, { withFileTypes: true }).catch(() => []))
    .filter((e) => e.isDirectory() && e.name.startsWith("build-"))
    .map((e) => path.join(workDir, e.name));
  const preflights = (await readdir(path.join(workDir, "preflight"), { withFileTypes: true }).catch(() => []))
    .filter((e) => e.isDirectory() && e.name.startsWith("clone-"))
    .map((e) => path.join(workDir, "preflight", e.name));
  const dirs = [...builds, ...preflights];
  if (dirs.length === 0) return { workspaces: 0, processes: 0 };
  const pids = await processesIn(dirs);
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // Gone meanwhile.
    }
  }
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  return { workspaces: dirs.length, processes: pids.length };
}
