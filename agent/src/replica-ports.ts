/**
 * The ports replicas listen on. They come from a range of their own (AGENT_REPLICA_PORTS), kept
 * outside the kernel's ephemeral range: a port from that range goes to any process that listens
 * without binding or connects out, tenant code included, so a replica's port taken from there
 * could be handed to another tenant between the agent choosing it and the replica binding it, or
 * after the replica crashed. Within the replica range, tenant code binds nothing but its own
 * replica's PORT (landlock.ts), so a port the agent found free stays the replica's to take.
 */
import { readFile } from "node:fs/promises";
import net from "node:net";

export interface PortRange {
  first: number;
  last: number;
}

/** `first-last`, as the config loader leaves a port-range. */
export function parsePortRange(text: string): PortRange {
  const [first, last] = text.split("-").map(Number);
  return { first: first!, last: last! };
}

/** The kernel's ephemeral range (net.ipv4.ip_local_port_range); null where it cannot be read. */
export async function ephemeralRange(file = "/proc/sys/net/ipv4/ip_local_port_range"): Promise<PortRange | null> {
  const text = await readFile(file, "utf8").catch(() => null);
  const [first, last] = (text ?? "").trim().split(/\s+/).map(Number);
  return Number.isInteger(first) && Number.isInteger(last) ? { first: first!, last: last! } : null;
}

export function overlaps(a: PortRange, b: PortRange): boolean {
  return a.first <= b.last && b.first <= a.last;
}

/**
 * Whether nothing listens on `port`, on any address of either family: a process that took the
 * port of a replica while it was down listens on one of them. Unlike isPortFree (@platform/fleet),
 * a family the host lacks counts as free.
 */
export async function portIsFree(port: number): Promise<boolean> {
  const tryOn = (host: string) =>
    new Promise<boolean>((resolve) => {
      const srv = net.createServer();
      // A host without IPv6 cannot be listened on there, which is no one else listening.
      srv.once("error", (err: NodeJS.ErrnoException) => resolve(err.code !== "EADDRINUSE"));
      srv.listen({ port, host, exclusive: true }, () => srv.close(() => resolve(true)));
    });
  return (await tryOn("0.0.0.0")) && (await tryOn("::"));
}

/**
 * A port of `range` that no replica here holds (`taken`: the agent's own, which may be down) and
 * nothing listens on. Random: agents sharing a host (and a range) seldom try the same one at once.
 */
export async function replicaPortIn(range: PortRange, taken: ReadonlySet<number>, isFree: (port: number) => Promise<boolean> = portIsFree): Promise<number> {
  const size = range.last - range.first + 1;
  const start = Math.floor(Math.random() * size);
  for (let i = 0; i < size; i++) {
    const port = range.first + ((start + i) % size);
    if (!taken.has(port) && (await isFree(port))) return port;
  }
  throw new Error(`No port is free for a replica in AGENT_REPLICA_PORTS (${range.first}-${range.last}).`);
}
