/**
 * The agent's heartbeat (ARCHITECTURE section 4): host facts, load sampled at send time,
 * version and whether the host takes new work. Silence for 60 s means the host is not live.
 */
import os from "node:os";
import { statfs } from "node:fs/promises";

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
  load: [number, number, number];
  disk: { path: string; total_bytes: number; free_bytes: number } | null;
  /** What runs here, per service of each deployed app (doc 2 section 4.10 derives runtime status from it). */
  inventory: InventoryEntry[];
  containers: { running: number; total: number };
  runtime: string;
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

export async function sampleHeartbeat(
  hostId: string,
  version: string,
  startedAt: Date,
  dataPath: string,
  runtime: { name: string; inventory: InventoryEntry[]; containers: { running: number; total: number } },
): Promise<Heartbeat> {
  const [l1 = 0, l5 = 0, l15 = 0] = os.loadavg();
  let disk: Heartbeat["disk"] = null;
  try {
    const s = await statfs(dataPath);
    disk = { path: dataPath, total_bytes: s.blocks * s.bsize, free_bytes: s.bavail * s.bsize };
  } catch {
    disk = null;
  }
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
    load: [l1, l5, l15],
    disk,
    inventory: runtime.inventory,
    containers: runtime.containers,
    runtime: runtime.name,
  };
}
