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
 * A replica may connect to its own port all the same (a server calling itself, a worker of its
 * own on 127.0.0.1:$PORT): the kernel marks each socket with the cgroup v2 of the process that made
 * it, and each replica runs in a cgroup of its own (cgroups.ts), so a set of cgroup and port pairs
 * lets exactly those through. It needs Linux 5.13 and cgroup v2 mounted under /sys/fs/cgroup
 * (where nft resolves cgroup paths); without them a replica's connection to its own port is
 * refused like any other, and the rest of the fence stands.
 *
 * The other way, replicas listen on every address of the host, Caddy being their one intended
 * client (over 127.0.0.1). The same table refuses new connections to a replica's port that come
 * in from outside the host, so no app, a private one included, is reached past the router.
 *
 * One table per tenant user, shared by the agents of a host that run tenant code as that user
 * (test fleets do): each keeps its router's port open, and its replicas' ports closed to the
 * outside, for PORT_TTL_S and renews them every minute, so the ports of an agent that stopped,
 * or of replicas that went, are let go by themselves; the rules are replaced in one transaction.
 * A firewall reload flushes the host's ruleset: the renewal puts the whole table back.
 */
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import path from "node:path";
import type { Logger } from "@platform/logger";
import { endedWith, findHostTool, runQuietly } from "./quiet-command.ts";

/** Ports tenant code may connect to on the host's own addresses besides the routers': DNS (a local resolver). */
const OPEN_LOCAL_PORTS = [53];
/** How long a router's port stays open, and a replica's closed to the outside, without its agent renewing it. */
const PORT_TTL_S = 300;
/**
 * Always denied: link-local, where cloud providers answer metadata (and credentials) requests, and
 * multicast and the limited broadcast, which reach the host's own listeners too.
 */
const ALWAYS_DENIED = ["169.254.0.0/16", "224.0.0.0/4", "255.255.255.255", "fe80::/10", "ff00::/8"];
/** How often the agent renews its ports (and puts the fence back when a firewall reload flushed it). */
const FENCE_RENEW_MS = 60_000;
/** Where nft finds the cgroup paths it is given. */
const NFT_CGROUP_ROOT = "/sys/fs/cgroup";
/**
 * The depths of the cgroup tree a replica's socket cgroup may be at, one rule each: a rule looks
 * a socket's ancestor at its depth up in the set, and only a replica's own cgroup is in it.
 */
const SOCKET_CGROUP_LEVELS = 12;

/** A replica's port, and the cgroup v2 (a directory) its sockets are known by. */
export interface OwnPort {
  cgroup: string;
  port: number;
}

export interface FenceSpec {
  /** The tenant user (AGENT_TENANT_UID) whose connections are fenced. */
  uid: number;
  /** The router's ports: open on the host's own addresses. */
  routerPorts: number[];
  /** The ports replicas serve on: closed to connections from outside the host. */
  replicaPorts: number[];
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
export function fenceRuleset(spec: FenceSpec, opts: { fresh: boolean; portTtlS?: number }): string {
  const t = `inet ${fenceTable(spec.uid)}`;
  const ttl = `${opts.portTtlS ?? PORT_TTL_S}s`;
  const nets = [...new Set([...ALWAYS_DENIED, ...spec.deniedNets])];
  const v4 = nets.filter((n) => isIP(n.split("/")[0]!) === 4);
  const v6 = nets.filter((n) => isIP(n.split("/")[0]!) === 6);
  const elements = (set: string, items: Array<string | number>) => (items.length > 0 ? [`add element ${t} ${set} { ${items.join(", ")} }`] : []);
  return [
    ...(opts.fresh ? [`add table ${t}`, `delete table ${t}`] : []),
    `add table ${t}`,
    `add set ${t} router_ports { type inet_service; flags timeout; }`,
    `add set ${t} replica_ports { type inet_service; flags timeout; }`,
    `add set ${t} denied4 { type ipv4_addr; flags interval; auto-merge; }`,
    `add set ${t} denied6 { type ipv6_addr; flags interval; auto-merge; }`,
    ...renewed(t, "router_ports", spec.routerPorts, ttl),
    ...renewed(t, "replica_ports", spec.replicaPorts, ttl),
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
    `add rule ${t} tenant fib daddr type local meta l4proto { tcp, udp } th dport { ${OPEN_LOCAL_PORTS.join(", ")} } accept`,
    // TCP alone: over UDP a tenant listening on the router's port number would hear the others.
    `add rule ${t} tenant fib daddr type local meta l4proto tcp th dport @router_ports accept`,
    `add rule ${t} tenant fib daddr type local reject`,
    // A broadcast or multicast send reaches the host's own listeners too (no ICMP answers one:
    // dropped, the send fails with EPERM).
    `add rule ${t} tenant fib daddr type { broadcast, multicast } drop`,
    `add rule ${t} tenant ip daddr @denied4 reject`,
    `add rule ${t} tenant ip6 daddr @denied6 reject`,
    `add chain ${t} input { type filter hook input priority filter; policy accept; }`,
    `flush chain ${t} input`,
    // From outside the host: a connection the host makes to itself, to any of its addresses, comes in on lo.
    `add rule ${t} input iifname != "lo" meta l4proto tcp th dport @replica_ports ct state new reject with tcp reset`,
    "",
  ].join("\n");
}

/** Elements of a timeout set, added, taken out and added again: one added while there keeps its old expiry. */
function renewed(t: string, set: string, elements: Array<string | number>, ttl: string): string[] {
  return [...new Set(elements)].flatMap((e) => [`add element ${t} ${set} { ${e} timeout ${ttl} }`, `delete element ${t} ${set} { ${e} }`, `add element ${t} ${set} { ${e} timeout ${ttl} }`]);
}

/** A cgroup directory as nft names it (relative to /sys/fs/cgroup); null where nft cannot. */
export function nftCgroupPath(dir: string): string | null {
  const relative = path.relative(NFT_CGROUP_ROOT, dir);
  return relative && !relative.startsWith("..") && !path.isAbsolute(relative) && /^[\w.@:+/-]+$/.test(relative) ? relative : null;
}

/** The own_ports elements of `ports`, as nft writes them. */
function ownPortElements(ports: OwnPort[]): string[] {
  return ports.flatMap(({ cgroup, port }) => {
    const name = nftCgroupPath(cgroup);
    return name ? [`"${name}" . ${port}`] : [];
  });
}

/**
 * The nft script that lets replicas through to their own ports, after fenceRuleset and in the
 * same transaction: applied apart, the moment between the two would refuse a replica calling
 * itself at every renewal.
 */
export function ownPortRuleset(uid: number): string {
  const t = `inet ${fenceTable(uid)}`;
  const levels = Array.from({ length: SOCKET_CGROUP_LEVELS }, (_, i) => `add rule ${t} own_port socket cgroupv2 level ${i + 1} . tcp dport @own_ports accept`);
  return [
    `add set ${t} own_ports { typeof socket cgroupv2 level 1 . tcp dport; flags timeout; }`,
    `add chain ${t} own_port`,
    `flush chain ${t} own_port`,
    ...levels,
    // Ahead of the rule that refuses the host's own addresses: fenceRuleset has just flushed the chain.
    `insert rule ${t} tenant ct state new fib daddr type local meta l4proto tcp jump own_port`,
    "",
  ].join("\n");
}

/**
 * Opens replicas' own ports for `ttl` (renewed), and closes `closing` (a replica's port before it
 * moved); what went wrong when some could not be opened.
 */
export async function openOwnPorts(uid: number, ports: OwnPort[], ttl = `${PORT_TTL_S}s`, closing: OwnPort[] = []): Promise<string | null> {
  const t = `inet ${fenceTable(uid)}`;
  const opening = ownPortElements(ports).map((e) => renewed(t, "own_ports", [e], ttl));
  // Added first, so that the deletion finds it there.
  const closed = ownPortElements(closing).map((e) => [`add element ${t} own_ports { ${e} timeout 1s }`, `delete element ${t} own_ports { ${e} }`]);
  if (opening.length + closed.length === 0) return null;
  const script = (lines: string[][]) => `${lines.flat().join("\n")}\n`;
  if ((await nft(["-f", "-"], script([...closed, ...opening]))) === null) return null;
  // One transaction fails whole: a replica that went meanwhile (its cgroup with it) must not keep
  // the others closed. A cgroup that went can hold no socket: what it was let through to is moot.
  const failures: string[] = [];
  for (const lines of closed) await nft(["-f", "-"], script([lines]));
  for (const lines of opening) {
    const failed = await nft(["-f", "-"], script([lines]));
    if (failed) failures.push(failed);
  }
  return failures.length > 0 ? failures.join("; ") : null;
}

/** Runs `nft args`, `input` on its stdin; null when it exited 0, else what went wrong. */
async function nft(args: string[], input?: string): Promise<string | null> {
  const bin = await findHostTool("nft");
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
  opts: { portTtlS?: number } = {},
): Promise<{ ok: true; created: boolean; noOwnPorts?: string } | { ok: false; reason: string }> {
  const fresh = (await nft(["list", "set", "inet", fenceTable(spec.uid), "router_ports"])) !== null;
  const fence = fenceRuleset(spec, { fresh, ...opts });
  const noOwnPorts = await nft(["-f", "-"], `${fence}${ownPortRuleset(spec.uid)}`);
  if (noOwnPorts === null) return { ok: true, created: fresh };
  // A kernel or nft without `socket cgroupv2` refuses the own ports: the rest of the fence stands all the same.
  const failed = await nft(["-f", "-"], fence);
  return failed ? { ok: false, reason: failed } : { ok: true, created: fresh, noOwnPorts };
}

export interface TenantFence {
  /** Closes a replica's port to the outside now, before the replica listens on it. */
  guard(port: number): Promise<void>;
  /** Lets a replica through to its own port now, before it starts. */
  openOwnPort(own: OwnPort): Promise<void>;
  /** Renews the fence now, with the replica ports of `replicaPorts` as they are. */
  renew(): Promise<void>;
  stop(): void;
}

/**
 * Puts the fence in place and keeps it there: renewed every `renewMs` with the replica ports
 * `replicaPorts` and `ownPorts` name then, put back whole when it is gone. Without nft (or root)
 * it says so once and tenant code runs unfenced.
 */
export async function keepTenantFence(
  spec: Omit<FenceSpec, "replicaPorts">,
  logger: Logger,
  opts: { replicaPorts?: () => number[]; ownPorts?: () => OwnPort[]; renewMs?: number; portTtlS?: number } = {},
): Promise<TenantFence> {
  const table = fenceTable(spec.uid);
  const ttl = `${opts.portTtlS ?? PORT_TTL_S}s`;
  const now = (): FenceSpec => ({ ...spec, replicaPorts: opts.replicaPorts?.() ?? [] });
  const put = await installTenantFence(now(), opts);
  if (!put.ok) {
    logger.warn({ uid: spec.uid, reason: put.reason }, "no tenant fence: tenant code can connect to the host's own services (Postgres, NATS, other replicas)");
    return { guard: async () => undefined, openOwnPort: async () => undefined, renew: async () => undefined, stop: () => undefined };
  }
  logger.info({ uid: spec.uid, table, deniedNets: spec.deniedNets }, "tenant fence in place: tenant code reaches none of the host's own services but the router");
  let ownPorts = !put.noOwnPorts;
  if (put.noOwnPorts) logger.warn({ table, reason: put.noOwnPorts }, "replicas cannot connect to their own port: the tenant fence refuses it like any of the host's");
  /**
   * The port each replica's cgroup was let through to last: the one a replica moved from (its
   * port taken while it was down) is closed to it at once, not when it expires. A replica gone is
   * not: no process is left in its cgroup to use it. Each renewal starts it again from the replicas
   * that run, so it does not grow with every replica ever started; one it missed (starting as it
   * was read) has its old port closed by expiry instead.
   */
  const opened = new Map<string, number>();
  /** `every`: `ports` are all the replicas that run; the others are forgotten. */
  const openOwn = async (ports: OwnPort[], every = false) => {
    if (!ownPorts) return;
    const closing = ports.flatMap(({ cgroup, port }) => {
      const before = opened.get(cgroup);
      return before !== undefined && before !== port ? [{ cgroup, port: before }] : [];
    });
    if (every) opened.clear();
    for (const { cgroup, port } of ports) opened.set(cgroup, port);
    const failed = await openOwnPorts(spec.uid, ports, ttl, closing);
    // The replica runs all the same: the next renewal tries again (one that went meanwhile is no longer asked for).
    if (failed) logger.warn({ table, reason: failed }, "a replica's own port could not be opened to it");
  };
  let renewing: Promise<void> | null = null;
  const renew = () =>
    (renewing ??= installTenantFence(now(), opts)
      .then(async (again) => {
        if (!again.ok) {
          logger.error({ table, reason: again.reason }, "the tenant fence could not be renewed: once gone, tenant code can connect to the host's own services");
          return;
        }
        if (again.created) logger.warn({ table }, "the tenant fence was gone (a firewall reload flushes it) and is back");
        ownPorts = !again.noOwnPorts;
        await openOwn(opts.ownPorts?.() ?? [], true);
      })
      .finally(() => (renewing = null)));
  const timer = setInterval(() => void renew(), opts.renewMs ?? FENCE_RENEW_MS);
  timer.unref();
  return {
    async guard(port) {
      const failed = await nft(["-f", "-"], `${renewed(`inet ${table}`, "replica_ports", [port], `${opts.portTtlS ?? PORT_TTL_S}s`).join("\n")}\n`);
      // The replica starts all the same: the next renewal closes its port, and says why it could not.
      if (failed) logger.error({ table, port, reason: failed }, "a replica's port could not be closed to the outside");
    },
    openOwnPort: (own) => openOwn([own]),
    renew,
    stop: () => clearInterval(timer),
  };
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
