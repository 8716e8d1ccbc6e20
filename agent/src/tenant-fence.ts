/**
 * The tenant fence: where tenant code may connect from a host. The sandbox (sandbox.ts) shares
 * the host's network, since a replica listens on its PORT for Caddy and a build fetches its
 * packages. Unfenced, tenant code would reach everything the host serves on its own addresses:
 * Postgres (which may trust local connections), NATS (where agents take their work), the fleet's
 * services, Caddy's admin API when it is on TCP, other tenants' replicas.
 *
 * Tenant code runs as the tenant user, so its sockets are told apart by their owner. An nftables
 * table rejects the tenant user's new connections to the host's own addresses, save the router's
 * port (an app calling another by its URL) and DNS, and to the denied networks: link-local (where
 * cloud metadata answers), the control plane's (AGENT_TENANT_DENIED_NETS) and the addresses of the
 * NATS server and services the agent is configured with. Rejected, not dropped: a connection
 * fails at once (ECONNREFUSED) rather than hanging. Answers on connections made to a replica
 * (Caddy's requests, health checks) are no new connections and pass.
 *
 * One table per tenant user, shared by the agents of a host that run tenant code as that user
 * (test fleets do): each keeps its router's port open for ROUTER_PORT_TTL_S and renews it every
 * minute, so the port of an agent that stopped, or moved its router, closes by itself; the rules
 * are replaced in one transaction. A firewall reload flushes the host's ruleset: the renewal puts
 * the whole table back.
 */
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import type { Logger } from "@platform/logger";
import { endedWith, findOnPath, runQuietly } from "./quiet-command.ts";

/** Ports tenant code may connect to on the host's own addresses besides the routers': DNS (a local resolver). */
const OPEN_LOCAL_PORTS = [53];
/** How long a router's port stays open without its agent renewing it. */
const ROUTER_PORT_TTL_S = 300;
/**
 * Always denied: link-local, where cloud providers answer metadata (and credentials) requests, and
 * multicast and the limited broadcast, which reach the host's own listeners too.
 */
const ALWAYS_DENIED = ["169.254.0.0/16", "224.0.0.0/4", "255.255.255.255", "fe80::/10", "ff00::/8"];
/** How often the agent renews its router's port (and puts the fence back when a firewall reload flushed it). */
const FENCE_RENEW_MS = 60_000;

export interface FenceSpec {
  /** The tenant user (AGENT_TENANT_UID) whose connections are fenced. */
  uid: number;
  /** The router's ports: open on the host's own addresses. */
  routerPorts: number[];
  /** Networks (address or address/prefix) tenant code may not connect to. */
  deniedNets: string[];
}

export function fenceTable(uid: number): string {
  return `platform_tenant_${uid}`;
}

/**
 * The nft script that puts the fence in place, or renews it, as one transaction. `fresh` makes
 * the table anew (there was none, or one of an older layout).
 */
export function fenceRuleset(spec: FenceSpec, opts: { fresh: boolean; routerPortTtlS?: number }): string {
  const t = `inet ${fenceTable(spec.uid)}`;
  const ttl = `${opts.routerPortTtlS ?? ROUTER_PORT_TTL_S}s`;
  const nets = [...new Set([...ALWAYS_DENIED, ...spec.deniedNets])];
  const v4 = nets.filter((n) => isIP(n.split("/")[0]!) === 4);
  const v6 = nets.filter((n) => isIP(n.split("/")[0]!) === 6);
  const elements = (set: string, items: Array<string | number>) => (items.length > 0 ? [`add element ${t} ${set} { ${items.join(", ")} }`] : []);
  return [
    ...(opts.fresh ? [`add table ${t}`, `delete table ${t}`] : []),
    `add table ${t}`,
    `add set ${t} router_ports { type inet_service; flags timeout; }`,
    `add set ${t} denied4 { type ipv4_addr; flags interval; auto-merge; }`,
    `add set ${t} denied6 { type ipv6_addr; flags interval; auto-merge; }`,
    ...elements("router_ports", OPEN_LOCAL_PORTS),
    // Added, taken out and added again: an element added while there keeps its old expiry.
    ...[...new Set(spec.routerPorts)].flatMap((p) => [
      `add element ${t} router_ports { ${p} timeout ${ttl} }`,
      `delete element ${t} router_ports { ${p} }`,
      `add element ${t} router_ports { ${p} timeout ${ttl} }`,
    ]),
    // Denying more than an agent asks for (another's, or an earlier config's) opens nothing.
    ...elements("denied4", v4),
    ...elements("denied6", v6),
    `add chain ${t} output { type filter hook output priority filter; policy accept; }`,
    `add chain ${t} tenant`,
    `flush chain ${t} output`,
    `flush chain ${t} tenant`,
    // Only sockets the tenant user owns: packets without a socket (the kernel's own) never jump.
    `add rule ${t} output meta skuid ${spec.uid} jump tenant`,
    `add rule ${t} tenant ct state established,related accept`,
    `add rule ${t} tenant fib daddr type local meta l4proto { tcp, udp } th dport @router_ports accept`,
    `add rule ${t} tenant fib daddr type local reject`,
    // A broadcast or multicast send reaches the host's own listeners too (no ICMP answers one:
    // dropped, the send fails with EPERM).
    `add rule ${t} tenant fib daddr type { broadcast, multicast } drop`,
    `add rule ${t} tenant ip daddr @denied4 reject`,
    `add rule ${t} tenant ip6 daddr @denied6 reject`,
    "",
  ].join("\n");
}

/** Runs `nft args`, `input` on its stdin; null when it exited 0, else what went wrong. */
async function nft(args: string[], input?: string): Promise<string | null> {
  // nft lives in sbin, which a service's PATH may lack.
  const bin = await findOnPath("nft", `${process.env.PATH ?? ""}:/usr/sbin:/sbin`);
  if (!bin) return "nft (nftables) is not installed";
  const ran = await runQuietly(bin, args, { input, timeoutMs: 10_000 }).catch((err: Error) => err);
  if (ran instanceof Error) return `nft could not be run: ${ran.message}`;
  return ran.code === 0 ? null : `nft failed (${endedWith(ran)}): ${ran.stderr || "no output"}`;
}

/**
 * Puts the fence in place, or renews it; `created`: there was none (of this layout) before, what
 * went wrong when it could not be.
 */
export async function installTenantFence(
  spec: FenceSpec,
  opts: { routerPortTtlS?: number } = {},
): Promise<{ ok: true; created: boolean } | { ok: false; reason: string }> {
  const fresh = (await nft(["list", "set", "inet", fenceTable(spec.uid), "router_ports"])) !== null;
  const failed = await nft(["-f", "-"], fenceRuleset(spec, { fresh, ...opts }));
  return failed ? { ok: false, reason: failed } : { ok: true, created: fresh };
}

/**
 * Puts the fence in place and keeps it there: renewed every `renewMs`, put back whole when it is
 * gone. Without nft (or root) it says so once and tenant code runs unfenced.
 */
export async function keepTenantFence(spec: FenceSpec, logger: Logger, opts: { renewMs?: number; routerPortTtlS?: number } = {}): Promise<{ stop(): void }> {
  const table = fenceTable(spec.uid);
  const put = await installTenantFence(spec, opts);
  if (!put.ok) {
    logger.warn({ uid: spec.uid, reason: put.reason }, "no tenant fence: tenant code can connect to the host's own services (Postgres, NATS, other replicas)");
    return { stop: () => undefined };
  }
  logger.info({ uid: spec.uid, table, deniedNets: spec.deniedNets }, "tenant fence in place: tenant code reaches none of the host's own services but the router");
  let renewing = false;
  const timer = setInterval(() => {
    if (renewing) return;
    renewing = true;
    void installTenantFence(spec, opts)
      .then((again) => {
        if (!again.ok) logger.error({ table, reason: again.reason }, "the tenant fence could not be renewed: once gone, tenant code can connect to the host's own services");
        else if (again.created) logger.warn({ table }, "the tenant fence was gone (a firewall reload flushes it) and is back");
      })
      .finally(() => (renewing = false));
  }, opts.renewMs ?? FENCE_RENEW_MS);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}

/**
 * The addresses of the servers behind `urls` (NATS, the services the agent calls): the control
 * plane as this agent knows it. A name that does not resolve now is left out.
 */
export async function controlPlaneAddresses(urls: string[]): Promise<string[]> {
  const hosts = new Set<string>();
  for (const raw of urls) {
    try {
      hosts.add(new URL(raw).hostname.replace(/^\[(.*)\]$/, "$1"));
    } catch {
      // Not a URL: the config loader has refused it already.
    }
  }
  const found = await Promise.all(
    [...hosts].map(async (host) => (isIP(host) ? [host] : (await lookup(host, { all: true }).catch(() => [])).map((a) => a.address))),
  );
  return [...new Set(found.flat())];
}
