/**
 * The deployed apps' replicas an agent left running (process runtime). They outlive the agent by
 * design; a test fleet, or `npm run reset`, takes them down with it.
 */
import { readdir, readFile, rmdir } from "node:fs/promises";
import path from "node:path";
import { sleep } from "./exec.ts";

/**
 * Stops every replica recorded under `<runDir>/replicas/<id>/replica.json` (its pid leads its own
 * process group) and removes its cgroups; returns how many were still running.
 */
export async function stopReplicas(runDir: string): Promise<number> {
  const dir = path.join(runDir, "replicas");
  const ids = await readdir(dir).catch(() => [] as string[]);
  let stopped = 0;
  const cgroups: string[] = [];
  for (const id of ids) {
    try {
      const { pid, cgroup, pidsCgroup, socketCgroup, cpuCgroup } = JSON.parse(await readFile(path.join(dir, id, "replica.json"), "utf8")) as {
        pid?: number;
        cgroup?: string | null;
        pidsCgroup?: string | null;
        socketCgroup?: string | null;
        cpuCgroup?: string | null;
      };
      // Memory, pids, cpu and the one its sockets are known by: one cgroup on cgroup v2, four on v1.
      for (const c of new Set([cgroup, pidsCgroup, socketCgroup, cpuCgroup])) if (c) cgroups.push(c);
      if (typeof pid === "number" && pid > 1) {
        process.kill(-pid, "SIGKILL");
        stopped++;
      }
    } catch {
      // Gone already, or never started: nothing to stop.
    }
  }
  for (const cgroup of cgroups) await removeCgroup(cgroup).catch(() => undefined);
  return stopped;
}

/** Removes a replica's (or a build's) cgroup; one already gone is fine. */
export async function removeCgroup(dir: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return;
      // A process that has just been killed can hold the cgroup for a moment.
      if (code !== "EBUSY" || attempt >= 20) throw err;
      await sleep(100);
    }
  }
}
