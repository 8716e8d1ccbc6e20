/**
 * The agent's heartbeat (ARCHITECTURE section 4): host facts, CPU load sampled since the last beat,
 * version and whether the host takes new work. Silence for 60 s means the host is not live.
 */
import os from "node:os";
import { readFile, statfs } from "node:fs/promises";

export const HEARTBEAT_INTERVAL_MS = 30_000;

export interface Heartbeat {
  host_id: string;
  hostname: string;
  version: string;
  schedulable: boolean;
  sent_at: string;
  started_at: string;
  cpus: number;
  memory_total_bytes: number;
  memory_free_bytes: number;
  /** The host's facts under the names of the spec's agent object (doc 2): only those measured here. */
  host_facts: HostFacts;
  host_load: HostLoad;
  disk: { path: string; total_bytes: number; free_bytes: number } | null;
  /** What runs here, per service of each deployed app (doc 2 section 4.10 derives runtime status from it). */
  inventory: InventoryEntry[];
  containers: { running: number; total: number };
  runtime: string;
}

export interface HostFacts {
  os?: string;
  kernel?: string;
  arch?: string;
  booted_at?: string;
}

export interface HostLoad {
  /** Busy share of all CPUs since the previous sample, 0-100. */
  cpu_pct: number;
  load_1m: number;
  load_5m: number;
  load_15m: number;
  sampled_at: string;
}

export interface InventoryEntry {
  group: string;
  app: string;
  branch: string;
  service: string;
  tag: string;
  colour: string;
  replicas_desired: number;
  replicas_running: number;
  /** The HTTP client a running replica of the service can run; null when none was probed. */
  http_client: string | null;
  capability_probed_at: string | null;
}

/** The operating system's own name for itself (`PRETTY_NAME` of os-release), else the kernel's. */
async function osName(): Promise<string> {
  for (const file of ["/etc/os-release", "/usr/lib/os-release"]) {
    const text = await readFile(file, "utf8").catch(() => "");
    const pretty = /^PRETTY_NAME=(?:"([^"]*)"|(.*))$/m.exec(text);
    const name = (pretty?.[1] ?? pretty?.[2] ?? "").trim();
    if (name) return name;
  }
  return `${os.type()} ${os.release()}`;
}

/** Facts the spec bounds at 1-256 characters; an empty one was not measured. */
function fact(value: string): string | undefined {
  const v = value.trim();
  return v ? v.slice(0, 256) : undefined;
}

export async function hostFacts(): Promise<HostFacts> {
  // Whole seconds: uptime is fractional, and the boot time must not wobble between heartbeats.
  const bootedAt = new Date(Math.round((Date.now() - os.uptime() * 1000) / 1000) * 1000);
  const facts: HostFacts = { os: fact(await osName()), kernel: fact(os.release()), arch: fact(os.machine()), booted_at: bootedAt.toISOString() };
  return Object.fromEntries(Object.entries(facts).filter(([, v]) => v !== undefined)) as HostFacts;
}

interface CpuTimes {
  busy: number;
  total: number;
  at: number;
}

function cpuTimes(): CpuTimes {
  let busy = 0;
  let total = 0;
  for (const { times } of os.cpus()) {
    const all = times.user + times.nice + times.sys + times.idle + times.irq;
    busy += all - times.idle;
    total += all;
  }
  return { busy, total, at: Date.now() };
}

/** The first sample is taken over this window; later ones over the time since the one before. */
const CPU_WINDOW_MS = 250;

/** CPU use between heartbeats: what the host did over the last 30 s, not in one instant. */
export class LoadSampler {
  #last: CpuTimes | null = null;
  #previous: HostLoad | null = null;

  async sample(): Promise<HostLoad> {
    if (!this.#last) {
      this.#last = cpuTimes();
      await new Promise((r) => setTimeout(r, CPU_WINDOW_MS));
    }
    // A heartbeat right after another (a replica crashed, say) repeats the last sample, time and
    // all: a few milliseconds of CPU times say nothing about the host's load.
    if (this.#previous && Date.now() - this.#last.at < CPU_WINDOW_MS) return this.#previous;
    const now = cpuTimes();
    const busy = now.busy - this.#last.busy;
    const total = now.total - this.#last.total;
    this.#last = now;
    const [load1 = 0, load5 = 0, load15 = 0] = os.loadavg();
    const pct = total > 0 ? (100 * busy) / total : 0;
    this.#previous = {
      cpu_pct: Math.round(Math.min(100, Math.max(0, pct)) * 10) / 10,
      load_1m: load1,
      load_5m: load5,
      load_15m: load15,
      sampled_at: new Date(now.at).toISOString(),
    };
    return this.#previous;
  }
}

export async function sampleHeartbeat(
  hostId: string,
  version: string,
  startedAt: Date,
  dataPath: string,
  runtime: () => { name: string; inventory: InventoryEntry[]; containers: { running: number; total: number } },
  load: LoadSampler,
): Promise<Heartbeat> {
  let disk: Heartbeat["disk"] = null;
  try {
    const s = await statfs(dataPath);
    disk = { path: dataPath, total_bytes: s.blocks * s.bsize, free_bytes: s.bavail * s.bsize };
  } catch {
    disk = null;
  }
  const [facts, hostLoad] = await Promise.all([hostFacts(), load.sample()]);
  // What runs is read last, once nothing is awaited any more: of two beats sampled at once (a
  // replica came back during the first one's CPU window), the one sent last tells the newest.
  const { name, inventory, containers } = runtime();
  return {
    host_id: hostId,
    hostname: os.hostname(),
    version,
    schedulable: true,
    sent_at: new Date().toISOString(),
    started_at: startedAt.toISOString(),
    cpus: os.cpus().length,
    memory_total_bytes: os.totalmem(),
    memory_free_bytes: os.freemem(),
    host_facts: facts,
    host_load: hostLoad,
    disk,
    inventory,
    containers,
    runtime: name,
  };
}
