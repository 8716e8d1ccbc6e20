/**
 * The agents registry, fed by heartbeats (`agent.hb.<host_id>`, every 30 s). An agent is live
 * when it was heard from in the last 60 seconds; placement only picks live, schedulable agents.
 */
import type { EntityManager } from "@platform/db";

export const LIVE_WINDOW_MS = 60_000;

export function isLive(lastSeen: Date, now: Date): boolean {
  return now.getTime() - lastSeen.getTime() <= LIVE_WINDOW_MS;
}

/** What the agent sends (agent/src/heartbeat.ts); everything beyond these is kept as facts. */
export interface HeartbeatMessage {
  host_id?: unknown;
  version?: unknown;
  schedulable?: unknown;
  [fact: string]: unknown;
}

const HOST_ID = /^[A-Za-z0-9_-]{1,128}$/;

export function validHostId(hostId: string): boolean {
  return HOST_ID.test(hostId) && hostId !== "any";
}

/**
 * Records a heartbeat. `hostId` comes from the subject (the last token of `agent.hb.<host_id>`);
 * `now` is this service's clock, never the agent's. Returns false for a malformed heartbeat.
 */
export async function recordHeartbeat(em: EntityManager, hostId: string, hb: HeartbeatMessage, now: Date): Promise<boolean> {
  if (!validHostId(hostId)) return false;
  if (typeof hb.host_id === "string" && hb.host_id !== hostId) return false;
  const version = typeof hb.version === "string" ? hb.version : "";
  const schedulable = hb.schedulable !== false;
  await em.getConnection().execute(
    `insert into agents (host_id, last_seen, facts, version, schedulable) values (?, ?, ?::jsonb, ?, ?)
     on conflict (host_id) do update set
       last_seen = greatest(agents.last_seen, excluded.last_seen),
       facts = excluded.facts, version = excluded.version, schedulable = excluded.schedulable`,
    [hostId, now, JSON.stringify(hb), version, schedulable],
    "run",
    em.getTransactionContext(),
  );
  return true;
}
