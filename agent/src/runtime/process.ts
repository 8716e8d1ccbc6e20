/**
 * The `process` runtime driver (ARCHITECTURE section 5): each replica is `sh -c <run command>` in
 * its own process group, sandboxed with bubblewrap, and memory- and process-limited through
 * cgroups when the host allows it (all probed at run time). Replicas outlive the agent: their stdout and stderr
 * are files, not pipes, and `<runDir>/replicas/<id>/replica.json` records what adopt() needs after
 * an agent restart. Output is followed by reading those files incrementally, for own children and
 * adopted replicas alike; what has been read goes into `output.log`, the merged, ordered view that
 * tail() reads, and the read position is saved so that lines written while the agent was away are
 * neither lost nor reported twice.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { watch, type FSWatcher } from "node:fs";
import { appendFile, mkdir, open, readdir, readFile, rename, rm, stat, truncate, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "@platform/logger";
import type { ExitInfo, HttpClient, OutputLine, ReplicaSpec, ReplicaState, RuntimeDriver } from "./types.ts";
import { errorText } from "../error-text.ts";
import { DEFAULT_PATH, findOnPath } from "../quiet-command.ts";
import { Sandbox, type TenantUser } from "../sandbox.ts";
import {
  createCpuCgroup,
  createMemoryCgroup,
  createPidsCgroup,
  createSocketCgroup,
  inCgroups,
  oomKillCount,
  probeSocketCgroup,
  probeTenantsCgroup,
  removeCgroup,
  tenantsCgroup,
  type CgroupParent,
  type TenantShare,
} from "../cgroups.ts";

export interface ProcessDriverOptions {
  runDir: string;
  /**
   * Paths a sandboxed replica must not see (the agent's own files, the platform's secrets): each
   * is covered by an empty tmpfs. The run directory always is; a replica sees only its release
   * and its home there.
   */
  hide?: string[];
  logger?: Logger;
  sandbox?: "auto" | "off";
  /** The user sandboxed replicas run as (AGENT_TENANT_UID); absent: the agent's own. */
  runAs?: TenantUser | null;
  memoryLimits?: "auto" | "off";
  /** The processes and threads one replica may run together (AGENT_PIDS_MAX); absent or 0: no limit. */
  pidsMax?: number;
  /** The cgroup all replicas are made in, and what they may use together; absent: `platform-tenants`, no limit of its own. */
  tenants?: TenantShare;
  /**
   * Lets a replica connect to its own port, which the tenant fence refuses the tenant user on the
   * host's addresses: called before the replica starts with the cgroup v2 its sockets are known
   * by. Absent: no such cgroup is made.
   */
  ownPort?(socketCgroup: string, port: number): void;
}

type Stream = "stdout" | "stderr";
const STREAMS: Stream[] = ["stdout", "stderr"];

const OUTPUT_POLL_MS = 200;
const EXIT_POLL_MS = 500;
/** `output.log` is rotated to `output.log.1` at this size, so a replica keeps at most twice it. */
const OUTPUT_MAX_BYTES = 10 * 1024 * 1024;
/** The raw stream files are emptied once read past this size: `output.log` keeps the history. */
const RAW_TRUNCATE_BYTES = 1024 * 1024;
/** A stream file is emptied only after its writer was quiet this long (see #truncateRead)... */
const RAW_QUIET_MS = 1_000;
/** ...or once it is this large. */
const RAW_HARD_CAP_BYTES = 64 * 1024 * 1024;
const READ_CHUNK_BYTES = 1024 * 1024;
/** A replica that writes without newlines must not grow the agent's memory without bound. */
const MAX_LINE_BYTES = 64 * 1024;
/** After SIGKILL a process can still take a while (uninterruptible I/O); past this stop() gives up waiting. */
const KILL_WAIT_MS = 10_000;
const REMOVE_GRACE_MS = 10_000;
/** The exit event of an own child follows the disappearance of its process group by milliseconds. */
const LEADER_EXIT_WAIT_MS = 2_000;
const HTTP_CLIENTS = ["curl", "python3", "node"] as const;

/**
 * The first HTTP client a replica with this PATH can run. A replica sees the host's files (read
 * only, in the sandbox), so looking on the host is looking where it would.
 */
export async function probeHttpClient(pathVar: string): Promise<HttpClient> {
  for (const name of HTTP_CLIENTS) if (await findOnPath(name, pathVar)) return name;
  return "none";
}

/** What replica.json holds. */
interface ReplicaRecord {
  spec: ReplicaSpec;
  pid: number;
  startedAt: string;
  /** Field 22 of /proc/<pid>/stat: tells the replica from a later process that got the same pid. */
  procStart: string;
  /** The memory cgroup (its OOM kills are the replica's). */
  cgroup: string | null;
  /** The pids cgroup; absent in records of agents before it, the same as `cgroup` on cgroup v2. */
  pidsCgroup?: string | null;
  /** The cgroup's OOM kill count at start: a cgroup reused by a restart keeps its old count. */
  oomBase: number;
  /** The cgroup v2 its sockets are known by (ownPort); absent in records of agents before it. */
  socketCgroup?: string | null;
  /** The cgroup weighing its processes together on the CPU; absent in records of agents before it. */
  cpuCgroup?: string | null;
  sandboxed: boolean;
  exit?: { code: number | null; signal: string | null; oomKilled: boolean; at: string };
  capability?: { httpClient: HttpClient; probedAt: string };
}

/** Every cgroup a replica was started in, each once (on cgroup v2 they are one). */
function cgroupsOf(record: Pick<ReplicaRecord, "cgroup" | "pidsCgroup" | "socketCgroup" | "cpuCgroup">): string[] {
  return [...new Set([record.cgroup, record.pidsCgroup, record.socketCgroup, record.cpuCgroup])].filter((c): c is string => !!c);
}

interface Cursor {
  /** Bytes of the stream file read so far. */
  pos: number;
  /** The end of the stream read after the last newline: a line still being written. */
  pending: Buffer;
}

interface Replica {
  record: ReplicaRecord;
  dir: string;
  startedAt: Date;
  running: boolean;
  exit: ExitInfo | null;
  /** Our own child (null when adopted): its exit event gives the exit code. */
  child: ChildProcess | null;
  leaderExit: Promise<{ code: number | null; signal: string | null }> | null;
  leaderDone: boolean;
  /** stop() or remove() asked for this exit: it is recorded, not reported. */
  stopRequested: boolean;
  stopping: Promise<void> | null;
  finishing: Promise<void> | null;
  cursors: Record<Stream, Cursor>;
  /** Output reads run one after another, so that lines keep their order. */
  reads: Promise<void>;
  readQueued: boolean;
  watchers: FSWatcher[];
}

interface ProcStat {
  state: string;
  pgrp: number;
  start: string;
}

async function procStat(pid: number): Promise<ProcStat | null> {
  try {
    const text = await readFile(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: fields are counted after the last ")".
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { state: fields[0] ?? "", pgrp: Number(fields[2]), start: fields[19] ?? "" };
  } catch {
    return null;
  }
}

const isLive = (s: ProcStat | null): s is ProcStat => s !== null && s.state !== "Z" && s.state !== "X";

/**
 * Whether any process of the group still runs. Zombies do not count: an adopted replica's leader
 * may stay a zombie for as long as its new parent fails to reap it.
 */
async function groupAlive(pgid: number): Promise<boolean> {
  try {
    process.kill(-pgid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
  const entries = await readdir("/proc").catch(() => [] as string[]);
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    const s = await procStat(Number(entry));
    if (isLive(s) && s.pgrp === pgid) return true;
  }
  return false;
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // Already gone.
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

async function waitFor(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= deadline) return false;
    await sleep(Math.min(50, Math.max(1, deadline - Date.now())));
  }
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.tmp`;
  await writeFile(tmp, JSON.stringify(value));
  await rename(tmp, file);
}

/** The last `n` lines of a file, reading backwards from its end only as far as needed. */
async function lastLines(file: string, n: number): Promise<string[]> {
  if (n <= 0) return [];
  const fh = await open(file, "r").catch(() => null);
  if (!fh) return [];
  try {
    const { size } = await fh.stat();
    let len = Math.min(size, 64 * 1024);
    for (;;) {
      const buf = Buffer.alloc(len);
      const { bytesRead } = await fh.read(buf, 0, len, size - len);
      const lines = buf.subarray(0, bytesRead).toString("utf8").split("\n");
      if (lines.at(-1) === "") lines.pop();
      // Unless the whole file was read, the first piece is the end of an earlier line.
      if (lines.length > n || len === size) return lines.slice(-n);
      len = Math.min(size, len * 4);
    }
  } finally {
    await fh.close();
  }
}



export class ProcessDriver implements RuntimeDriver {
  readonly name = "process";
  readonly #runDir: string;
  readonly #logger: Logger | undefined;
  readonly #memoryMode: "auto" | "off";
  readonly #pidsMax: number;
  readonly #tenants: TenantShare;
  readonly #sandbox: Sandbox;
  readonly #replicas = new Map<string, Replica>();
  readonly #exitListeners: Array<(state: ReplicaState) => void> = [];
  readonly #outputListeners: Array<(line: OutputLine) => void> = [];
  #memory: Promise<CgroupParent | null> | null = null;
  #pids: Promise<CgroupParent | null> | null = null;
  #sockets: Promise<CgroupParent | null> | null = null;
  #cpu: Promise<CgroupParent | null> | null = null;
  readonly #ownPort: ProcessDriverOptions["ownPort"];
  #outputTimer: NodeJS.Timeout | null = null;
  #exitTimer: NodeJS.Timeout | null = null;
  #closed = false;

  constructor(opts: ProcessDriverOptions) {
    this.#runDir = path.resolve(opts.runDir);
    this.#logger = opts.logger;
    this.#sandbox = new Sandbox({ hide: [this.#runDir, ...(opts.hide ?? [])], mode: opts.sandbox, runAs: opts.runAs, logger: opts.logger, what: "replicas" });
    this.#memoryMode = opts.memoryLimits ?? "auto";
    this.#pidsMax = opts.pidsMax ?? 0;
    this.#tenants = opts.tenants ?? { name: "tenants", memoryMb: 0, pidsMax: 0 };
    this.#ownPort = opts.ownPort;
  }

  /**
   * Starts one replica. An exited replica of the same id (a restart by the supervisor) is started
   * again in place: its output log continues, so tail() still shows what came before the restart.
   */
  async start(spec: ReplicaSpec): Promise<ReplicaState> {
    this.#assertOpen();
    const previous = this.#replicas.get(spec.id);
    if (previous?.running) throw new Error(`replica ${spec.id} is already running`);
    const dir = this.#dirOf(spec.id);
    const home = path.join(dir, "home");
    const releaseDir = path.resolve(spec.releaseDir);
    await mkdir(home, { recursive: true });
    // The release is written by its replicas (as on a host of one's own), and the home is theirs.
    await this.#sandbox.handOver([releaseDir, home]);
    const memory = spec.memoryMb ? await this.#memoryReady() : null;

    let cgroup: string | null = null;
    let oomBase = 0;
    if (memory && spec.memoryMb) {
      try {
        cgroup = await createMemoryCgroup(memory, spec.id, spec.memoryMb);
        oomBase = await oomKillCount(cgroup);
      } catch (err) {
        this.#logger?.warn({ replica: spec.id, err: errorText(err) }, "could not create the replica's memory cgroup; it runs without a memory limit");
        cgroup = null;
      }
    }

    const pids = this.#pidsMax > 0 ? await this.#pidsReady() : null;
    const pidsCgroup = await this.#cgroupOf(spec, pids, (parent) => createPidsCgroup(parent, spec.id, this.#pidsMax), "pids", "it runs without a process limit");
    const cpuCgroup = await this.#cgroupOf(spec, await this.#cpuReady(), (parent) => createCpuCgroup(parent, spec.id), "cpu", "its processes share the CPU one by one");
    const sockets = spec.port !== null && this.#ownPort ? await this.#socketsReady() : null;
    const socketCgroup = await this.#cgroupOf(spec, sockets, (parent) => createSocketCgroup(parent, spec.id), "socket", "it cannot connect to its own port");
    // On cgroup v2 they are one cgroup.
    const cgroups = cgroupsOf({ cgroup, pidsCgroup, socketCgroup, cpuCgroup });

    for (const old of previous ? cgroupsOf(previous.record) : []) {
      if (!cgroups.includes(old)) await removeCgroup(old).catch(() => undefined);
    }

    // No --die-with-parent: replicas must outlive the agent.
    const sandboxed = await this.#sandbox.wrap(["/bin/sh", "-c", spec.command], {
      writable: [releaseDir, home],
      chdir: releaseDir,
      dieWithParent: false,
      bindPorts: spec.port === null ? [] : [spec.port],
      cgroups,
    });
    const argv = inCgroups(cgroups, sandboxed.argv);
    if (socketCgroup !== null && spec.port !== null) this.#ownPort?.(socketCgroup, spec.port);
    const env: Record<string, string> = {
      PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? DEFAULT_PATH}`,
      HOME: home,
      LANG: "C.UTF-8",
      ...spec.env,
    };

    const cursors = await this.#loadCursors(dir);
    const out = await open(path.join(dir, "stdout.log"), "a");
    const err = await open(path.join(dir, "stderr.log"), "a").catch(async (e: unknown) => {
      await out.close();
      throw e;
    });
    let child: ChildProcess;
    let leaderExit: Promise<{ code: number | null; signal: string | null }>;
    try {
      child = spawn(argv[0]!, argv.slice(1), { cwd: releaseDir, env, stdio: ["ignore", out.fd, err.fd], detached: true });
      // Listened for at once: a command that fails at once exits while its record is still being
      // written below, and an exit no one listened for is never seen (the replica would stay
      // "running", its crash unreported).
      const spawned = child;
      leaderExit = new Promise((resolve) => spawned.once("exit", (code, signal) => resolve({ code, signal })));
      await new Promise<void>((resolve, reject) => {
        child.once("spawn", resolve);
        child.once("error", reject);
      });
    } catch (e) {
      for (const dir of cgroups) await removeCgroup(dir).catch(() => undefined);
      throw new Error(`replica ${spec.id} could not be started: ${errorText(e)}`);
    } finally {
      await Promise.all([out.close(), err.close()]);
    }
    child.unref();
    const pid = child.pid!;
    const startedAt = new Date();
    const record: ReplicaRecord = {
      spec,
      pid,
      startedAt: startedAt.toISOString(),
      procStart: (await procStat(pid))?.start ?? "",
      cgroup,
      pidsCgroup,
      oomBase,
      socketCgroup,
      cpuCgroup,
      sandboxed: sandboxed.sandboxed,
      capability: { httpClient: await probeHttpClient(env.PATH ?? DEFAULT_PATH), probedAt: new Date().toISOString() },
    };
    const replica = this.#newReplica(record, dir, cursors);
    replica.child = child;
    replica.leaderExit = leaderExit;
    void leaderExit.then(() => {
      replica.leaderDone = true;
      void this.#checkExit(replica);
    });
    this.#replicas.set(spec.id, replica);
    await writeJsonAtomic(path.join(dir, "replica.json"), record);
    this.#follow(replica);
    return this.#snapshot(replica);
  }

  async stop(replicaId: string, graceMs: number): Promise<void> {
    this.#assertOpen();
    const replica = this.#replicas.get(replicaId);
    if (!replica?.running) return;
    replica.stopRequested = true;
    replica.stopping ??= this.#terminate(replica, graceMs);
    return replica.stopping;
  }

  list(): ReplicaState[] {
    return [...this.#replicas.values()].map((r) => this.#snapshot(r));
  }

  async remove(replicaId: string): Promise<void> {
    this.#assertOpen();
    const replica = this.#replicas.get(replicaId);
    if (replica?.running) await this.stop(replicaId, REMOVE_GRACE_MS);
    const dir = this.#dirOf(replicaId);
    let record: ReplicaRecord | null;
    if (replica) {
      await replica.finishing;
      this.#unfollow(replica);
      await replica.reads;
      record = replica.record;
    } else {
      // Never adopted: its record still names its cgroups.
      record = await readFile(path.join(dir, "replica.json"), "utf8").then((text) => JSON.parse(text) as ReplicaRecord, () => null);
    }
    for (const cgroup of record ? cgroupsOf(record) : []) await removeCgroup(cgroup);
    this.#replicas.delete(replicaId);
    await rm(dir, { recursive: true, force: true });
  }

  async tail(replicaId: string, n = 30): Promise<string[]> {
    const replica = this.#replicas.get(replicaId);
    if (replica && !this.#closed) await this.#read(replica, false);
    const dir = this.#dirOf(replicaId);
    let lines = await lastLines(path.join(dir, "output.log"), n);
    if (lines.length < n) lines = [...(await lastLines(path.join(dir, "output.log.1"), n - lines.length)), ...lines];
    return lines.map((line) => line.slice(line.indexOf(" ", line.indexOf(" ") + 1) + 1));
  }

  onExit(listener: (state: ReplicaState) => void): void {
    this.#exitListeners.push(listener);
  }

  onOutput(listener: (line: OutputLine) => void): void {
    this.#outputListeners.push(listener);
  }

  async adopt(): Promise<ReplicaState[]> {
    this.#assertOpen();
    // The host's sandbox and cgroups are probed while the agent starts, not by its first deploy.
    void this.#sandbox.ready();
    void this.#memoryReady();
    if (this.#pidsMax > 0) void this.#pidsReady();
    if (this.#ownPort) void this.#socketsReady();
    void this.#cpuReady();
    const root = path.join(this.#runDir, "replicas");
    const ids = await readdir(root).catch(() => [] as string[]);
    const adopted: ReplicaState[] = [];
    for (const id of ids) {
      const known = this.#replicas.get(id);
      if (known) {
        adopted.push(this.#snapshot(known));
        continue;
      }
      const dir = path.join(root, id);
      let record: ReplicaRecord;
      try {
        record = JSON.parse(await readFile(path.join(dir, "replica.json"), "utf8")) as ReplicaRecord;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOENT") this.#logger?.warn({ replica: id, err: errorText(err) }, "unreadable replica.json; the replica is not adopted");
        continue;
      }
      const replica = this.#newReplica(record, dir, await this.#loadCursors(dir));
      this.#replicas.set(id, replica);
      const leader = await procStat(record.pid);
      if (!record.exit && isLive(leader) && leader.start === record.procStart) {
        this.#follow(replica);
      } else {
        // Died while the agent was away: its last output is still read, for tail().
        await this.#read(replica, true);
        replica.running = false;
        replica.exit = record.exit
          ? { ...record.exit, at: new Date(record.exit.at) }
          : { code: null, signal: null, oomKilled: record.cgroup !== null && (await oomKillCount(record.cgroup)) > record.oomBase, at: new Date() };
        if (!record.exit) await this.#persistExit(replica);
      }
      adopted.push(this.#snapshot(replica));
    }
    return adopted;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#outputTimer) clearInterval(this.#outputTimer);
    if (this.#exitTimer) clearInterval(this.#exitTimer);
    this.#outputTimer = this.#exitTimer = null;
    for (const replica of this.#replicas.values()) this.#unfollow(replica);
    await Promise.all([...this.#replicas.values()].map((r) => r.reads));
  }


  #assertOpen(): void {
    if (this.#closed) throw new Error("the process driver is closed");
  }

  #dirOf(replicaId: string): string {
    if (!replicaId || replicaId.includes("/") || replicaId === "." || replicaId === "..") throw new Error(`invalid replica id ${JSON.stringify(replicaId)}`);
    return path.join(this.#runDir, "replicas", replicaId);
  }

  #newReplica(record: ReplicaRecord, dir: string, cursors: Record<Stream, Cursor>): Replica {
    return {
      record,
      dir,
      startedAt: new Date(record.startedAt),
      running: true,
      exit: null,
      child: null,
      leaderExit: null,
      leaderDone: false,
      stopRequested: false,
      stopping: null,
      finishing: null,
      cursors,
      reads: Promise.resolve(),
      readQueued: false,
      watchers: [],
    };
  }

  #snapshot(replica: Replica): ReplicaState {
    return {
      spec: replica.record.spec,
      handle: String(replica.record.pid),
      startedAt: replica.startedAt,
      running: replica.running,
      exit: replica.exit ? { ...replica.exit } : null,
      ...(replica.record.socketCgroup ? { socketCgroup: replica.record.socketCgroup } : {}),
      ...(replica.record.capability ? { capability: { httpClient: replica.record.capability.httpClient, probedAt: new Date(replica.record.capability.probedAt) } } : {}),
    };
  }

  #pidsReady(): Promise<CgroupParent | null> {
    this.#pids ??= probeTenantsCgroup("pids", this.#tenants).then((probe) => {
      if (probe.ok) {
        this.#logger?.info({ cgroup: probe.cgroup.dir, version: probe.cgroup.version, max: this.#pidsMax }, "replica process limits are enforced with cgroups");
        return probe.cgroup;
      }
      this.#logger?.warn({ reason: probe.reason }, "replicas run without a process limit");
      return null;
    });
    return this.#pids;
  }

  /** A cgroup of the replica's under `parent`; null, said in the log, when none can be made there: the replica runs without what it gives. */
  async #cgroupOf(spec: ReplicaSpec, parent: CgroupParent | null, create: (parent: CgroupParent) => Promise<string>, what: string, without: string): Promise<string | null> {
    if (!parent) return null;
    try {
      return await create(parent);
    } catch (err) {
      this.#logger?.warn({ replica: spec.id, err: errorText(err) }, `could not create the replica's ${what} cgroup; ${without}`);
      return null;
    }
  }

  #cpuReady(): Promise<CgroupParent | null> {
    this.#cpu ??= probeTenantsCgroup("cpu", this.#tenants).then((probe) => {
      if (probe.ok) return probe.cgroup;
      this.#logger?.warn({ reason: probe.reason }, "replicas share the CPU by process, not weighed together");
      return null;
    });
    return this.#cpu;
  }

  #socketsReady(): Promise<CgroupParent | null> {
    this.#sockets ??= probeSocketCgroup().then(async (probe) => {
      if (probe.ok) return tenantsCgroup(probe.cgroup, this.#tenants);
      this.#logger?.warn({ reason: probe.reason }, "replicas cannot connect to their own port: their sockets cannot be told apart from other tenants'");
      return null;
    });
    return this.#sockets;
  }

  #memoryReady(): Promise<CgroupParent | null> {
    if (this.#memoryMode === "off") return Promise.resolve(null);
    this.#memory ??= probeTenantsCgroup("memory", this.#tenants).then((probe) => {
      if (probe.ok) {
        this.#logger?.info({ cgroup: probe.cgroup.dir, version: probe.cgroup.version }, "replica memory limits are enforced with cgroups");
        return probe.cgroup;
      }
      this.#logger?.warn({ reason: probe.reason }, "replicas run without memory limits");
      return null;
    });
    return this.#memory;
  }

  /** Where the previous agent stopped reading; a replica never read before starts at the end of its files. */
  async #loadCursors(dir: string): Promise<Record<Stream, Cursor>> {
    const saved = await readFile(path.join(dir, "cursor.json"), "utf8").then(
      (text) => JSON.parse(text) as Partial<Record<Stream, number>>,
      () => null,
    );
    const cursors = {} as Record<Stream, Cursor>;
    for (const stream of STREAMS) {
      const size = await stat(path.join(dir, `${stream}.log`)).then((s) => s.size, () => 0);
      const pos = saved?.[stream];
      cursors[stream] = { pos: typeof pos === "number" && pos <= size ? pos : size, pending: Buffer.alloc(0) };
    }
    return cursors;
  }

  #follow(replica: Replica): void {
    // Polling alone would merge stdout and stderr only to 200 ms; the watchers read as soon as a line lands.
    for (const stream of STREAMS) {
      try {
        const watcher = watch(path.join(replica.dir, `${stream}.log`), { persistent: false }, () => this.#queueRead(replica));
        watcher.on("error", () => watcher.close());
        replica.watchers.push(watcher);
      } catch {
        // Polling covers it.
      }
    }
    this.#outputTimer ??= setInterval(() => {
      for (const r of this.#replicas.values()) if (r.running) this.#queueRead(r);
    }, OUTPUT_POLL_MS).unref();
    this.#exitTimer ??= setInterval(() => {
      for (const r of this.#replicas.values()) if (r.running) void this.#checkExit(r);
    }, EXIT_POLL_MS).unref();
  }

  #unfollow(replica: Replica): void {
    for (const watcher of replica.watchers) watcher.close();
    replica.watchers = [];
  }

  /** True once the replica's leader has exited and no process of its group is left. */
  /** The replica's command has ended (under bubblewrap, the outer bwrap exits with it). */
  async #leaderGone(replica: Replica): Promise<boolean> {
    if (replica.child) return replica.leaderDone;
    const { pid, procStart } = replica.record;
    const s = await procStat(pid);
    return !(isLive(s) && s.start === procStart);
  }

  async #gone(replica: Replica): Promise<boolean> {
    if (!(await this.#leaderGone(replica))) return false;
    // Under bubblewrap the leader dies of SIGTERM at once while the command may still be shutting down.
    return !(await groupAlive(replica.record.pid));
  }

  async #checkExit(replica: Replica): Promise<void> {
    if (this.#closed || !replica.running || replica.finishing || replica.stopping) return;
    try {
      if (!(await this.#leaderGone(replica))) return;
      // The command ended on its own, leaving processes it forked in the replica's group: they go
      // with it. Waited for, they kept a dead replica reported running (and unrestarted, its
      // requests failing) until they ended on their own, minutes later.
      if (await groupAlive(replica.record.pid)) {
        signalGroup(replica.record.pid, "SIGKILL");
        await waitFor(() => this.#gone(replica), KILL_WAIT_MS);
      }
      await this.#finish(replica);
    } catch (err) {
      this.#logger?.warn({ replica: replica.record.spec.id, err: errorText(err) }, "checking a replica's exit failed");
    }
  }

  async #terminate(replica: Replica, graceMs: number): Promise<void> {
    const { pid, spec } = replica.record;
    signalGroup(pid, "SIGTERM");
    if (!(await waitFor(() => this.#gone(replica), graceMs))) {
      signalGroup(pid, "SIGKILL");
      if (!(await waitFor(() => this.#gone(replica), KILL_WAIT_MS))) {
        this.#logger?.warn({ replica: spec.id, pid }, "replica still has processes after SIGKILL");
      }
    }
    await this.#finish(replica);
  }

  #finish(replica: Replica): Promise<void> {
    replica.finishing ??= (async () => {
      const leader = replica.leaderExit
        ? await Promise.race([replica.leaderExit, sleep(LEADER_EXIT_WAIT_MS).then(() => null)])
        : null;
      this.#unfollow(replica);
      await this.#read(replica, true);
      const { cgroup, oomBase } = replica.record;
      // Adopted replicas' exit status is unknown: then the cgroup's counter alone tells.
      const killed = leader === null || leader.signal === "SIGKILL" || leader.code === 128 + 9;
      const oomKilled = cgroup !== null && killed && (await oomKillCount(cgroup)) > oomBase;
      replica.exit = { code: leader?.code ?? null, signal: leader?.signal ?? null, oomKilled, at: new Date() };
      replica.running = false;
      if (this.#closed) return;
      await this.#persistExit(replica).catch((err: unknown) => {
        this.#logger?.warn({ replica: replica.record.spec.id, err: errorText(err) }, "could not record the replica's exit");
      });
      if (replica.stopRequested) return;
      const state = this.#snapshot(replica);
      for (const listener of this.#exitListeners) {
        try {
          listener(state);
        } catch (err) {
          this.#logger?.error({ err: errorText(err) }, "exit listener failed");
        }
      }
    })();
    return replica.finishing;
  }

  async #persistExit(replica: Replica): Promise<void> {
    const exit = replica.exit!;
    replica.record = { ...replica.record, exit: { code: exit.code, signal: exit.signal, oomKilled: exit.oomKilled, at: exit.at.toISOString() } };
    await writeJsonAtomic(path.join(replica.dir, "replica.json"), replica.record);
  }

  /** Polls and watchers only queue a read when none is waiting: one is enough to catch up. */
  #queueRead(replica: Replica): void {
    if (replica.readQueued || this.#closed) return;
    replica.readQueued = true;
    replica.reads = replica.reads.then(() => {
      replica.readQueued = false;
      return this.#readOutput(replica, false);
    });
  }

  #read(replica: Replica, final: boolean): Promise<void> {
    replica.reads = replica.reads.then(() => this.#readOutput(replica, final));
    return replica.reads;
  }

  async #readOutput(replica: Replica, final: boolean): Promise<void> {
    try {
      while (await this.#readOnce(replica, final));
    } catch (err) {
      this.#logger?.warn({ replica: replica.record.spec.id, err: errorText(err) }, "reading a replica's output failed");
    }
  }

  /** Reads what is new in both stream files into output.log; true when there is more to read. */
  async #readOnce(replica: Replica, final: boolean): Promise<boolean> {
    const batches: Array<{ stream: Stream; lines: string[]; mtime: bigint }> = [];
    let more = false;
    // Both files' sizes first, then each read up to its own: one cut across the streams. Read one
    // after the other, a line written to stderr after the last stdout read came in ahead of stdout
    // lines written before it (a crash's last words among its earlier output).
    const sizes = await Promise.all(STREAMS.map((stream) => stat(path.join(replica.dir, `${stream}.log`), { bigint: true }).catch(() => null)));
    for (const [i, stream] of STREAMS.entries()) {
      const cursor = replica.cursors[stream];
      const file = path.join(replica.dir, `${stream}.log`);
      const st = sizes[i];
      if (!st) continue;
      const size = Number(st.size);
      if (size < cursor.pos) Object.assign(cursor, { pos: 0, pending: Buffer.alloc(0) });
      const lines: string[] = [];
      if (size > cursor.pos) {
        const len = Math.min(size - cursor.pos, READ_CHUNK_BYTES);
        const buf = Buffer.alloc(len);
        const fh = await open(file, "r");
        let bytesRead: number;
        try {
          ({ bytesRead } = await fh.read(buf, 0, len, cursor.pos));
        } finally {
          await fh.close();
        }
        cursor.pos += bytesRead;
        more ||= cursor.pos < size;
        let data = Buffer.concat([cursor.pending, buf.subarray(0, bytesRead)]);
        for (let nl = data.indexOf(10); nl !== -1; nl = data.indexOf(10)) {
          lines.push(data.subarray(0, nl).toString("utf8").replace(/\r$/, ""));
          data = data.subarray(nl + 1);
        }
        while (data.length > MAX_LINE_BYTES) {
          lines.push(data.subarray(0, MAX_LINE_BYTES).toString("utf8"));
          data = data.subarray(MAX_LINE_BYTES);
        }
        cursor.pending = Buffer.from(data);
      }
      if (final && !more && cursor.pending.length) {
        lines.push(cursor.pending.toString("utf8"));
        cursor.pending = Buffer.alloc(0);
      }
      if (lines.length) batches.push({ stream, lines, mtime: st.mtimeNs });
    }
    if (!batches.length) {
      // A quiet writer is when a read-through stream file can be emptied.
      await this.#truncateRead(replica);
      return more;
    }

    // Within one read the stream written to last goes last: exact when each holds one new line.
    batches.sort((a, b) => (a.mtime < b.mtime ? -1 : a.mtime > b.mtime ? 1 : 0));
    const at = new Date();
    const marker = { stdout: "o", stderr: "e" } as const;
    const text = batches.flatMap((b) => b.lines.map((line) => `${at.getTime()} ${marker[b.stream]} ${line}\n`)).join("");
    await this.#appendOutput(replica, text);
    // Saved after output.log and before the listeners: an agent dying in between repeats no line.
    await this.#saveCursors(replica);
    const replicaId = replica.record.spec.id;
    for (const batch of batches) {
      for (const line of batch.lines) {
        for (const listener of this.#outputListeners) {
          try {
            listener({ replicaId, spec: replica.record.spec, stream: batch.stream, line, at });
          } catch (err) {
            this.#logger?.error({ err: errorText(err) }, "output listener failed");
          }
        }
      }
    }
    await this.#truncateRead(replica);
    return more;
  }

  async #appendOutput(replica: Replica, text: string): Promise<void> {
    const file = path.join(replica.dir, "output.log");
    const size = await stat(file).then((s) => s.size, () => 0);
    if (size > 0 && size + Buffer.byteLength(text) > OUTPUT_MAX_BYTES) await rename(file, `${file}.1`);
    await appendFile(file, text);
  }

  async #saveCursors(replica: Replica): Promise<void> {
    const saved: Record<Stream, number> = { stdout: 0, stderr: 0 };
    for (const stream of STREAMS) saved[stream] = replica.cursors[stream].pos - replica.cursors[stream].pending.length;
    await writeJsonAtomic(path.join(replica.dir, "cursor.json"), saved);
  }

  /**
   * Empties a stream file that has been read to its end. The replica writes in append mode, so
   * its next write lands at the new start; a write between the size check and the truncate would
   * be lost, so a file is emptied only once its writer has been quiet for a moment, unless it has
   * grown past the hard cap (a replica that never stops writing: the disk comes first).
   */
  async #truncateRead(replica: Replica): Promise<void> {
    let changed = false;
    for (const stream of STREAMS) {
      const cursor = replica.cursors[stream];
      if (cursor.pos < RAW_TRUNCATE_BYTES || cursor.pending.length) continue;
      const file = path.join(replica.dir, `${stream}.log`);
      const st = await stat(file);
      if (st.size !== cursor.pos) continue;
      if (Date.now() - st.mtimeMs < RAW_QUIET_MS && st.size < RAW_HARD_CAP_BYTES) continue;
      await truncate(file, 0);
      cursor.pos = 0;
      changed = true;
    }
    if (changed) await this.#saveCursors(replica);
  }
}
