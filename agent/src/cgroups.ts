/**
 * The cgroups of tenant code on a host: each replica (runtime/process.ts) and each build command
 * (builder.ts) runs in cgroups of its own, in the tenants' cgroup (tenantsCgroup, holding them
 * all to the host's share for tenants) under the agent's own:
 * - memory, limited with swap included so that passing the limit ends in an OOM kill the agent
 *   can tell apart from a crash;
 * - pids, bounding its processes and threads together, so that a fork bomb fails its own forks
 *   rather than the host's (every tenant runs as the one tenant user, whose process count no
 *   per-user limit could split between tenants);
 * - cpu, weighing the replica or build as a whole (TENANT_CPU_WEIGHT), so that tenants share the
 *   CPU by app rather than by process, at the low priority their nice value gives each process.
 * v2 first (one cgroup holds both limits), v1 where that is all the host has (one hierarchy
 * each); probed at run time, since a container may not let the agent write either.
 */
import { mkdir, readdir, readFile, rmdir, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { errorText } from "./error-text.ts";

export type Controller = "memory" | "pids" | "cpu";

/** Where a controller's limited cgroups are made: the agent's own cgroup in its hierarchy. */
export interface CgroupParent {
  version: 1 | 2;
  dir: string;
}

export type CgroupProbe = { ok: true; cgroup: CgroupParent } | { ok: false; reason: string };

/** Each controller's file that says "no limit" (what a probe writes). */
const UNLIMITED: Record<Controller, Record<1 | 2, [file: string, value: string]>> = {
  memory: { 1: ["memory.limit_in_bytes", "-1"], 2: ["memory.max", "max"] },
  pids: { 1: ["pids.max", "max"], 2: ["pids.max", "max"] },
  cpu: { 1: ["cpu.shares", "1024"], 2: ["cpu.weight", "100"] },
};

/**
 * The CPU weight of each replica's and build's cgroup: about that of one process at nice 10
 * (TENANT_NICENESS), so that a tenant with many busy processes weighs no more than one. They
 * share the tenants' cgroup, which keeps the default weight (1024 shares, weight 100): all tenant
 * code together weighs as one of the host's processes at nice 0 against the platform's.
 */
export const TENANT_CPU_WEIGHT: Record<1 | 2, [file: string, value: string]> = { 1: ["cpu.shares", "110"], 2: ["cpu.weight", "10"] };

interface Mount {
  root: string;
  point: string;
  fstype: string;
  superOptions: string[];
}

const unescapeMount = (s: string) => s.replace(/\\(\d{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8)));

function parseMountinfo(text: string): Mount[] {
  const mounts: Mount[] = [];
  for (const line of text.split("\n")) {
    const [pre, post] = line.split(" - ");
    if (!pre || !post) continue;
    const fields = pre.split(" ");
    const [fstype = "", , superOptions = ""] = post.split(" ");
    mounts.push({ root: unescapeMount(fields[3] ?? ""), point: unescapeMount(fields[4] ?? ""), fstype, superOptions: superOptions.split(",") });
  }
  return mounts;
}

/** Where a cgroup path of /proc/self/cgroup is in the file system, given the hierarchy's mount. */
function cgroupDir(mount: Mount, cgroupPath: string): string | null {
  if (mount.root === "/") return path.join(mount.point, cgroupPath);
  if (cgroupPath === mount.root || cgroupPath.startsWith(`${mount.root}/`)) return path.join(mount.point, cgroupPath.slice(mount.root.length));
  return null;
}

async function tryCgroup(cgroup: CgroupParent, controller: Controller): Promise<string | null> {
  if (cgroup.version === 2) {
    const controllers = await readFile(path.join(cgroup.dir, "cgroup.controllers"), "utf8").catch(() => "");
    if (!controllers.split(/\s+/).includes(controller)) return `cgroup v2: the ${controller} controller is not available in ${cgroup.dir}`;
    const subtree = await readFile(path.join(cgroup.dir, "cgroup.subtree_control"), "utf8").catch(() => "");
    if (!subtree.split(/\s+/).includes(controller)) {
      const enable = () => writeFile(path.join(cgroup.dir, "cgroup.subtree_control"), `+${controller}`);
      try {
        await enable().catch(async (err: NodeJS.ErrnoException) => {
          // v2 gives controllers to the children of a cgroup that holds no process itself (the
          // root excepted): a systemd service's, a container's. Its processes, the agent's
          // own among them, move into a leaf of their own first.
          if (err.code !== "EBUSY") throw err;
          await moveIntoLeaf(cgroup.dir);
          await enable();
        });
      } catch (err) {
        return `cgroup v2: cannot enable the ${controller} controller for children of ${cgroup.dir} (${errorText(err)})`;
      }
    }
  }
  const probe = path.join(cgroup.dir, `platform-probe-${controller}-${process.pid}`);
  try {
    await mkdir(probe);
  } catch (err) {
    return `cgroup v${cgroup.version}: cannot create a cgroup under ${cgroup.dir} (${errorText(err)})`;
  }
  const [file, value] = UNLIMITED[controller][cgroup.version];
  try {
    await writeFile(path.join(probe, file), value);
    return null;
  } catch (err) {
    return `cgroup v${cgroup.version}: cannot set a ${controller} limit under ${cgroup.dir} (${errorText(err)})`;
  } finally {
    await rmdir(probe).catch(() => undefined);
  }
}

/** The leaf cgroup v2 the agent's own processes move into, so that its cgroup may give controllers to the ones it makes. */
export const AGENT_LEAF = "platform-agent";

/** Moves every process of cgroup v2 `dir` into its child AGENT_LEAF. */
export async function moveIntoLeaf(dir: string): Promise<void> {
  const leaf = path.join(dir, AGENT_LEAF);
  await mkdir(leaf).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== "EEXIST") throw err;
  });
  const pids = (await readFile(path.join(dir, "cgroup.procs"), "utf8")).split("\n").filter(Boolean);
  for (const pid of pids) {
    // A process that has exited meanwhile is no longer there to move.
    await writeFile(path.join(leaf, "cgroup.procs"), pid).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ESRCH") throw err;
    });
  }
}

interface Placement {
  /** Each line of /proc/self/cgroup: the controllers of a hierarchy (v2: none) and this process's cgroup in it. */
  memberships: Array<{ controllers: string[]; path: string }>;
  mounts: Mount[];
}

/** Where this process is in each cgroup hierarchy, and where those are mounted. */
async function placement(): Promise<Placement | string> {
  try {
    const own = await readFile("/proc/self/cgroup", "utf8");
    const mounts = parseMountinfo(await readFile("/proc/self/mountinfo", "utf8"));
    const memberships = own
      .split("\n")
      .filter(Boolean)
      .map((line) => {
        const first = line.indexOf(":");
        const second = line.indexOf(":", first + 1);
        return { controllers: line.slice(first + 1, second).split(","), path: line.slice(second + 1) };
      });
    return { memberships, mounts };
  } catch (err) {
    return `cgroups cannot be read here (${errorText(err)})`;
  }
}

/**
 * This process's own cgroup v2 directory, where the cgroups it makes go: the one it was started
 * in, also once it has moved into its AGENT_LEAF; null without a v2 hierarchy mounted for it.
 */
function v2Dir({ memberships, mounts }: Placement): string | null {
  const v2 = memberships.find((m) => m.controllers.length === 1 && m.controllers[0] === "");
  const v2Mount = mounts.find((m) => m.fstype === "cgroup2");
  const dir = v2 && v2Mount ? cgroupDir(v2Mount, v2.path) : null;
  return dir && path.basename(dir) === AGENT_LEAF ? path.dirname(dir) : dir;
}

/** Finds a hierarchy of `controller` this process may create limited cgroups in; v2 first. */
export async function probeCgroup(controller: Controller): Promise<CgroupProbe> {
  const placed = await placement();
  if (typeof placed === "string") return { ok: false, reason: placed };
  const candidates: CgroupParent[] = [];
  const v2 = v2Dir(placed);
  if (v2) candidates.push({ version: 2, dir: v2 });
  const v1 = placed.memberships.find((m) => m.controllers.includes(controller));
  const v1Mount = placed.mounts.find((m) => m.fstype === "cgroup" && m.superOptions.includes(controller));
  const v1Dir = v1 && v1Mount ? cgroupDir(v1Mount, v1.path) : null;
  if (v1Dir) candidates.push({ version: 1, dir: v1Dir });
  if (!candidates.length) return { ok: false, reason: `no ${controller} cgroup hierarchy is mounted for this process` };
  const reasons: string[] = [];
  for (const cgroup of candidates) {
    const reason = await tryCgroup(cgroup, controller);
    if (reason === null) return { ok: true, cgroup };
    reasons.push(reason);
  }
  return { ok: false, reason: reasons.join("; ") };
}

/**
 * Where this process may make cgroups v2, with controllers or none, to tell sockets apart: the
 * kernel marks every socket with the v2 cgroup of the process that made it, whatever hierarchy
 * the limits are in (a host with cgroup v1 limits mounts v2 beside them, /sys/fs/cgroup/unified).
 */
export async function probeSocketCgroup(): Promise<CgroupProbe> {
  const placed = await placement();
  if (typeof placed === "string") return { ok: false, reason: placed };
  const dir = v2Dir(placed);
  if (!dir) return { ok: false, reason: "no cgroup v2 hierarchy is mounted for this process" };
  const probe = path.join(dir, `platform-probe-socket-${process.pid}`);
  try {
    await mkdir(probe);
    await rmdir(probe);
    return { ok: true, cgroup: { version: 2, dir } };
  } catch (err) {
    return { ok: false, reason: `cgroup v2: cannot create a cgroup under ${dir} (${errorText(err)})` };
  }
}

/** The cgroup `platform-<name>` under `parent`, made when missing. */
async function childCgroup(parent: CgroupParent, name: string): Promise<string> {
  const dir = path.join(parent.dir, `platform-${name}`);
  await mkdir(dir).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== "EEXIST") throw err;
  });
  return dir;
}

/** A cgroup `platform-<name>` under `parent` holding its processes to `memoryMb` (swap included). */
export async function createMemoryCgroup(parent: CgroupParent, name: string, memoryMb: number): Promise<string> {
  const dir = await childCgroup(parent, name);
  await limitMemory(dir, parent.version, memoryMb);
  return dir;
}

async function limitMemory(dir: string, version: 1 | 2, memoryMb: number): Promise<void> {
  const bytes = String(memoryMb * 1024 * 1024);
  // The limit covers swap too, so that reaching it ends in an OOM kill rather than in swapping.
  if (version === 2) {
    await writeFile(path.join(dir, "memory.max"), bytes);
    await writeFile(path.join(dir, "memory.swap.max"), "0").catch(() => undefined);
  } else {
    const memsw = path.join(dir, "memory.memsw.limit_in_bytes");
    // v1 refuses a memory limit above the memory+swap one: raise that first when growing.
    await writeFile(path.join(dir, "memory.limit_in_bytes"), bytes).catch(async () => {
      await writeFile(memsw, bytes);
      await writeFile(path.join(dir, "memory.limit_in_bytes"), bytes);
    });
    await writeFile(memsw, bytes).catch(() => undefined);
  }
}

/**
 * What all tenant code of a host may use together, in the cgroup `platform-<name>` (by default
 * `platform-tenants`) that every replica's and build's cgroups are made in: 0 for no such limit.
 */
export interface TenantShare {
  name: string;
  memoryMb: number;
  pidsMax: number;
}

/**
 * The host's share for tenant code: `memoryPercent` of its memory (AGENT_TENANT_MEMORY_PERCENT)
 * and `pidsPercent` of the processes and threads its kernel allows (AGENT_TENANT_PIDS_PERCENT,
 * of the lower of kernel.pid_max and kernel.threads-max). Each replica and build has limits of
 * its own, but nothing bounds how many replicas tenants run: without this, together they could
 * take the memory or the process slots Postgres, NATS and the agent need.
 */
export async function hostShare(memoryPercent: number, pidsPercent: number): Promise<TenantShare> {
  const kernel = async (name: string) => Number((await readFile(`/proc/sys/kernel/${name}`, "utf8").catch(() => "")).trim()) || Infinity;
  const slots = Math.min(await kernel("pid_max"), await kernel("threads-max"));
  return {
    name: "tenants",
    memoryMb: Math.floor(((os.totalmem() / 1024 / 1024) * memoryPercent) / 100),
    pidsMax: Number.isFinite(slots) ? Math.floor((slots * pidsPercent) / 100) : 0,
  };
}

/**
 * The cgroup all tenant code of the host is held in under `parent` (the agent's own, as probed):
 * made with the share's limit of `controller`, which on cgroup v2 it also gives its children.
 */
export async function tenantsCgroup(parent: CgroupParent, share: TenantShare, controller?: Controller): Promise<CgroupParent> {
  const dir = await childCgroup(parent, share.name);
  if (parent.version === 2 && controller) await writeFile(path.join(dir, "cgroup.subtree_control"), `+${controller}`);
  if (controller === "memory" && share.memoryMb > 0) await limitMemory(dir, parent.version, share.memoryMb);
  if (controller === "pids" && share.pidsMax > 0) await writeFile(path.join(dir, "pids.max"), String(share.pidsMax));
  return { version: parent.version, dir };
}

/** probeCgroup, then the tenants' cgroup of `share` in what it found: where tenant code's cgroups of `controller` are made. */
export async function probeTenantsCgroup(controller: Controller, share: TenantShare): Promise<CgroupProbe> {
  const probe = await probeCgroup(controller);
  if (!probe.ok) return probe;
  try {
    return { ok: true, cgroup: await tenantsCgroup(probe.cgroup, share, controller) };
  } catch (err) {
    return { ok: false, reason: `cgroup v${probe.cgroup.version}: cannot make the tenants' cgroup under ${probe.cgroup.dir} (${errorText(err)})` };
  }
}

/**
 * The cgroup v2 `platform-<name>` under `parent` (probeSocketCgroup) that the sockets of its
 * processes are known by; on a host of cgroup v2 limits, the same cgroup as the limits of that name.
 */
export function createSocketCgroup(parent: CgroupParent, name: string): Promise<string> {
  return childCgroup(parent, name);
}

/**
 * A cgroup `platform-<name>` under `parent` holding its processes and threads to `max` together.
 * On cgroup v2 it is the same cgroup as the memory one of that name.
 */
export async function createPidsCgroup(parent: CgroupParent, name: string, max: number): Promise<string> {
  const dir = await childCgroup(parent, name);
  await writeFile(path.join(dir, "pids.max"), String(max));
  return dir;
}

/**
 * A cgroup `platform-<name>` under `parent` weighing its processes together (TENANT_CPU_WEIGHT).
 * On cgroup v2 it is the same cgroup as the memory one of that name.
 */
export async function createCpuCgroup(parent: CgroupParent, name: string): Promise<string> {
  const dir = await childCgroup(parent, name);
  const [file, value] = TENANT_CPU_WEIGHT[parent.version];
  await writeFile(path.join(dir, file), value);
  return dir;
}

/** How many times a fork or a new thread in the cgroup was refused for its pids.max. */
export async function pidsLimitHits(dir: string): Promise<number> {
  const text = await readFile(path.join(dir, "pids.events"), "utf8").catch(() => "");
  return Number(text.match(/^max (\d+)$/m)?.[1] ?? 0);
}

/** `argv` run in `cgroups`: the shell joins each before it execs the rest, so the command never runs unlimited. */
export function inCgroups(cgroups: string[], argv: string[]): string[] {
  if (cgroups.length === 0) return argv;
  const procs = [...new Set(cgroups)].map((dir) => path.join(dir, "cgroup.procs"));
  return ["/bin/sh", "-c", 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n - 1)); done; exec "$@"', "sh", String(procs.length), ...procs, ...argv];
}

/** How many processes the kernel OOM-killed in the cgroup (v2 memory.events, v1 memory.oom_control). */
export async function oomKillCount(dir: string): Promise<number> {
  for (const file of ["memory.events", "memory.oom_control"]) {
    const text = await readFile(path.join(dir, file), "utf8").catch(() => null);
    const match = text?.match(/^oom_kill (\d+)$/m);
    if (match) return Number(match[1]);
  }
  // Kernels before 4.13 have no oom_kill counter in v1: hitting the limit is the best sign left.
  const failcnt = await readFile(path.join(dir, "memory.failcnt"), "utf8").catch(() => "0");
  return Number(failcnt.trim()) || 0;
}

// One removal for the agent and for what stops a fleet's replicas (test fleets, npm run reset).
export { removeCgroup } from "@platform/fleet";

/**
 * Removes the cgroups `platform-<prefix>*` under `parent` that hold no process and were made over
 * `minAgeMs` ago: those of builds a stopped agent left (its build commands died with it). Younger
 * ones may be another agent's on this host, made for a command about to join; ones in use stay
 * (the kernel refuses to remove them). Answers how many went.
 */
export async function removeIdleCgroups(parent: CgroupParent, prefix: string, minAgeMs: number): Promise<number> {
  const names = (await readdir(parent.dir).catch(() => [] as string[])).filter((n) => n.startsWith(`platform-${prefix}`));
  let removed = 0;
  for (const name of names) {
    const dir = path.join(parent.dir, name);
    const st = await stat(dir).catch(() => null);
    if (!st?.isDirectory() || Date.now() - st.mtimeMs < minAgeMs) continue;
    if (await rmdir(dir).then(() => true, () => false)) removed++;
  }
  return removed;
}
