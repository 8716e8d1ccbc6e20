/**
 * Service runtime status (spec doc 2 sections 3.6 and 4.10), computed per read from the agents'
 * heartbeats: each live agent reports what it runs (`inventory`). No operation moves it.
 *
 * - `edge`: a static service (no containers);
 * - `running`: at least one live host reports a running replica; replicas_running counts hosts;
 * - `not_running`: every known host was heard from recently and none runs the service;
 * - `unknown` otherwise, with the first reason that applies, in the spec's priority order:
 *   read_failed (the agents' reports could not be read), no_alive_agents, ambiguous_name (the
 *   name is an app in several groups and the caller named none), fleet_below_floor (fewer live
 *   hosts than the fleet should have: the service may run on a missing one), inventory_stale (a
 *   live host sent no inventory), host_silent (a known host is silent, so the service may run
 *   there unseen).
 */
import { isLive } from "./agents.ts";

/** Hosts not heard from in this long have left the fleet and no longer make a status unknown. */
export const FORGOTTEN_AFTER_MS = 24 * 3600 * 1000;

export interface AgentReport {
  hostId: string;
  lastSeen: Date;
  facts: Record<string, unknown>;
}

export interface ServiceRuntime {
  replicas_running: number | null;
  hosts_unverified: number | null;
  reason: string | null;
}

export interface ServiceStatusView {
  name: string;
  status: "running" | "not_running" | "unknown" | "edge";
  runtime: ServiceRuntime;
  /** Advisory: the HTTP client a running replica can run, as its host last probed it. */
  http_client: string | null;
  /** Null whenever http_client is. */
  capability_probed_at: string | null;
}

/** One line of an agent's heartbeat inventory (agent/src/heartbeat.ts). */
export interface InventoryEntry {
  group?: unknown;
  app?: unknown;
  branch?: unknown;
  service?: unknown;
  replicas_running?: unknown;
  http_client?: unknown;
  capability_probed_at?: unknown;
}

const HTTP_CLIENTS = new Set(["curl", "python3", "node", "none"]);

/** The most recent probe among the hosts running the service. */
function capabilityOf(lines: InventoryEntry[]): Pick<ServiceStatusView, "http_client" | "capability_probed_at"> {
  let best: { client: string; at: string } | null = null;
  for (const e of lines) {
    if (typeof e.http_client !== "string" || !HTTP_CLIENTS.has(e.http_client) || typeof e.capability_probed_at !== "string") continue;
    if (!best || e.capability_probed_at > best.at) best = { client: e.http_client, at: e.capability_probed_at };
  }
  return best ? { http_client: best.client, capability_probed_at: best.at } : { http_client: null, capability_probed_at: null };
}

/** Whether an inventory line reports `service` of the app branch. */
export function reportsService(e: InventoryEntry, target: { groupSlug: string; appName: string; branch: string }, service: string): boolean {
  return e.group === target.groupSlug && e.app === target.appName && e.branch === target.branch && e.service === service;
}

export interface StatusContext {
  /** The agents' reports; null when they could not be read. */
  agents: AgentReport[] | null;
  /** The app name resolves to apps of several groups, and the caller chose none. */
  ambiguous: boolean;
  /** Live agents the fleet should have (FLEET_FLOOR). */
  floor: number;
  now: Date;
}

export function servicesStatus(
  target: { groupSlug: string; appName: string; branch: string; isStatic: boolean },
  services: string[],
  { agents, ambiguous, floor, now }: StatusContext,
): ServiceStatusView[] {
  const none = { http_client: null, capability_probed_at: null };
  const edge = (name: string): ServiceStatusView => ({ name, status: "edge", runtime: { replicas_running: null, hosts_unverified: null, reason: null }, ...none });
  if (agents === null) {
    return services.map((name) =>
      target.isStatic ? edge(name) : { name, status: "unknown", runtime: { replicas_running: null, hosts_unverified: null, reason: "read_failed" }, ...none },
    );
  }
  const known = agents.filter((a) => now.getTime() - a.lastSeen.getTime() <= FORGOTTEN_AFTER_MS);
  const live = known.filter((a) => isLive(a.lastSeen, now));
  const silent = known.length - live.length;
  const inventories = live.map((a) => (Array.isArray(a.facts.inventory) ? (a.facts.inventory as InventoryEntry[]) : null));
  return services.map((name) => {
    if (target.isStatic) return edge(name);
    const runningLines = inventories.flatMap((inv) => inv?.filter((e) => reportsService(e, target, name) && Number(e.replicas_running) > 0) ?? []);
    const hostsRunning = inventories.filter((inv) =>
      inv?.some((e) => reportsService(e, target, name) && Number(e.replicas_running) > 0),
    ).length;
    const unknown = (reason: string): ServiceStatusView => ({ name, status: "unknown", runtime: { replicas_running: hostsRunning, hosts_unverified: silent, reason }, ...none });
    if (live.length === 0) return { name, status: "unknown", runtime: { replicas_running: null, hosts_unverified: silent, reason: "no_alive_agents" }, ...none };
    // The caller did not say which group's app it means; one of them was picked to answer.
    if (ambiguous) return unknown("ambiguous_name");
    if (hostsRunning > 0) return { name, status: "running", runtime: { replicas_running: hostsRunning, hosts_unverified: silent, reason: null }, ...capabilityOf(runningLines) };
    if (live.length < floor) return unknown("fleet_below_floor");
    if (inventories.some((inv) => inv === null)) return unknown("inventory_stale");
    if (silent > 0) return unknown("host_silent");
    return { name, status: "not_running", runtime: { replicas_running: 0, hosts_unverified: 0, reason: null }, ...none };
  });
}
