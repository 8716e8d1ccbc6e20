/**
 * The tenant fence on this machine: what the tenant user's code can connect to. A user of its own
 * (not the agent's default), so the fleets of other tests keep theirs. Skipped, saying why, where
 * nftables or the sandbox cannot run.
 */
import { execFile, spawn } from "node:child_process";
import dgram from "node:dgram";
import net from "node:net";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { probeSandbox, Sandbox } from "../src/sandbox.ts";
import { findHostTool } from "../src/quiet-command.ts";
import { createLogger } from "@platform/logger";
import { controlPlaneAddresses, fenceRuleset, fenceTable, installTenantFence, keepTenantFence, nftCgroupPath, type OwnPort } from "../src/tenant-fence.ts";
import { createSocketCgroup, inCgroups, probeSocketCgroup } from "../src/cgroups.ts";
import { removeCgroup } from "@platform/fleet";

const TENANT = { uid: 61999, gid: 61999 };
const run = promisify(execFile);

async function listen(): Promise<net.Server> {
  // The connections made here are closed at once: a reset is no error of the test's.
  const server = net.createServer((s) => s.on("error", () => undefined).end("hello\n"));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}
const portOf = (s: net.Server) => (s.address() as net.AddressInfo).port;

/** Whether `port` on 127.0.0.1 answers a connection made by this process (as the agent's user). */
function connect(host: string, port: number): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port, timeout: 3000 }, () => {
      s.destroy();
      resolve("connected");
    });
    s.on("timeout", () => {
      s.destroy();
      resolve("timeout");
    });
    s.on("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
}

describe("fenceRuleset", () => {
  it("names the tenant user's sockets only, opens the router's port and DNS on the host's addresses, and denies the networks given", () => {
    const rules = fenceRuleset({ uid: 61000, routerPorts: [8480], replicaPorts: [41000, 41000], deniedNets: ["10.1.0.0/16", "fd00::/8", "10.1.0.0/16"] }, { fresh: false });
    expect(rules).toContain("add table inet platform_tenant_61000");
    expect(rules).not.toContain("delete table");
    expect(rules).toContain("add rule inet platform_tenant_61000 tenant fib daddr type local meta l4proto { tcp, udp } th dport { 53 } accept");
    expect(rules).toContain("add rule inet platform_tenant_61000 tenant fib daddr type local meta l4proto tcp th dport @router_ports accept");
    expect(rules).toContain("add element inet platform_tenant_61000 router_ports { 8480 timeout 300s }");
    expect(rules).toContain("add element inet platform_tenant_61000 denied4 { 169.254.0.0/16, 224.0.0.0/4, 255.255.255.255, 10.1.0.0/16 }");
    expect(rules).toContain("add element inet platform_tenant_61000 denied6 { fe80::/10, ff00::/8, fd00::/8 }");
    expect(rules).toContain("add rule inet platform_tenant_61000 output meta skuid 61000 jump tenant");
    // Replica ports are closed to connections from outside the host, each named once.
    expect(rules.match(/add element inet platform_tenant_61000 replica_ports \{ 41000 timeout 300s \}/g)).toHaveLength(2);
    expect(rules).toContain('add rule inet platform_tenant_61000 input iifname != "lo" meta l4proto tcp th dport @replica_ports ct state new reject with tcp reset');
    // Rules are replaced, not added to, when an agent renews the fence; other agents' ports stay.
    expect(rules.indexOf("flush chain inet platform_tenant_61000 tenant")).toBeLessThan(rules.indexOf("add rule inet platform_tenant_61000 tenant"));
    expect(rules).not.toContain("flush set");
    // A table made anew replaces one of an older layout.
    expect(fenceRuleset({ uid: 61000, routerPorts: [8480], replicaPorts: [], deniedNets: [] }, { fresh: true }).startsWith("add table inet platform_tenant_61000\ndelete table inet platform_tenant_61000\n")).toBe(true);
  });
});

describe("controlPlaneAddresses", () => {
  it("resolves the hosts of the URLs the agent is configured with", async () => {
    expect(await controlPlaneAddresses(["nats://127.0.0.1:4222", "http://[::1]:7003", "http://localhost:7002", "http://no-such-host.invalid:1"])).toEqual(
      expect.arrayContaining(["127.0.0.1", "::1"]),
    );
  });
});

/**
 * What each connection made by tenant code (in the sandbox, as the tenant user) ended in; with
 * `ownNetwork`, from a network namespace of its own, as a build command's; with `cgroup`, from
 * that cgroup, as a replica's. With `forMs`, connections are made again and again for that long,
 * and each target's distinct outcomes are given, comma-separated.
 */
async function fromTenantCode(targets: Record<string, [string, number]>, opts: { ownNetwork?: boolean; cgroup?: string; forMs?: number } = {}): Promise<Record<string, string>> {
  const box = new Sandbox({ what: "tests", runAs: TENANT, hide: [] });
  const script = `
    const net = require("node:net");
    const connect = ([host, port]) => new Promise((resolve) => {
      const s = net.connect({ host, port, timeout: 3000 }, () => { s.destroy(); resolve("connected"); });
      s.on("timeout", () => { s.destroy(); resolve("timeout"); });
      s.on("error", (e) => resolve(e.code));
    });
    const targets = ${JSON.stringify(targets)};
    const until = Date.now() + ${opts.forMs ?? 0};
    (async () => {
      const seen = Object.fromEntries(Object.keys(targets).map((k) => [k, new Set()]));
      do {
        const r = await Promise.all(Object.values(targets).map(connect));
        Object.keys(targets).forEach((k, i) => seen[k].add(r[i]));
      } while (Date.now() < until);
      console.log(JSON.stringify(Object.fromEntries(Object.entries(seen).map(([k, s]) => [k, [...s].sort().join(",")]))));
    })();
  `;
  const wrapped = await box.wrap([process.execPath, "-e", script], { writable: [], chdir: "/", dieWithParent: true, ownNetwork: opts.ownNetwork });
  const { network } = wrapped;
  const argv = opts.cgroup ? inCgroups([opts.cgroup], wrapped.argv) : wrapped.argv;
  if (!opts.ownNetwork) return JSON.parse((await run(argv[0]!, argv.slice(1))).stdout) as Record<string, string>;
  expect(network).not.toBeNull();
  const child = spawn(argv[0]!, argv.slice(1), { stdio: network!.stdio(["ignore", "pipe", "ignore"]) });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += String(d)));
  const exited = new Promise((r) => child.once("exit", r));
  await network!.attach(child);
  await exited;
  return JSON.parse(out) as Record<string, string>;
}

const sandbox = await probeSandbox(TENANT);
const probe = sandbox.ok && sandbox.user ? await installTenantFence({ uid: TENANT.uid, routerPorts: [], replicaPorts: [], deniedNets: [] }) : null;
const socketCgroups = await probeSocketCgroup();
const noSocketCgroups = !socketCgroups.ok ? ` (skipped: ${socketCgroups.reason})` : nftCgroupPath(socketCgroups.cgroup.dir) === null ? ` (skipped: nft cannot name ${socketCgroups.cgroup.dir})` : probe?.ok && probe.noOwnPorts ? ` (skipped: ${probe.noOwnPorts})` : "";
const skip = !sandbox.ok ? sandbox.reason : !sandbox.user ? (sandbox.userProblem ?? "no tenant user") : probe && !probe.ok ? probe.reason : "";

describe.skipIf(skip !== "")(`what tenant code can connect to behind the fence${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let hostService: net.Server;
  let router: net.Server;
  let otherRouter: net.Server;
  let earlierRouter: net.Server;
  let udp: dgram.Socket;
  beforeAll(async () => {
    [hostService, router, otherRouter, earlierRouter] = await Promise.all([listen(), listen(), listen(), listen()]);
    udp = dgram.createSocket("udp4");
    await new Promise<void>((resolve) => udp.bind(0, "0.0.0.0", resolve));
    // An agent that stopped renewing its router's port (it stopped, or moved the router)...
    expect(await installTenantFence({ uid: TENANT.uid, routerPorts: [portOf(earlierRouter)], replicaPorts: [], deniedNets: ["198.51.100.0/24"] }, { portTtlS: 1 })).toMatchObject({ ok: true });
    // ...and two agents of one host with the same tenant user: each keeps its own open.
    expect(await installTenantFence({ uid: TENANT.uid, routerPorts: [portOf(router)], replicaPorts: [], deniedNets: ["192.0.2.0/24"] })).toEqual({ ok: true, created: false });
    expect(await installTenantFence({ uid: TENANT.uid, routerPorts: [portOf(otherRouter)], replicaPorts: [], deniedNets: [] })).toEqual({ ok: true, created: false });
    await new Promise((r) => setTimeout(r, 1500));
  });
  afterAll(async () => {
    udp?.close();
    await Promise.all([hostService, router, otherRouter, earlierRouter].map((s) => new Promise((r) => s?.close(r))));
    await run("nft", ["delete", "table", "inet", fenceTable(TENANT.uid)]).catch(() => undefined);
  });

  it("refuses the host's own services and the denied networks at once, and lets the routers' ports through", async () => {
    const seen = await fromTenantCode({
      hostService: ["127.0.0.1", portOf(hostService)],
      router: ["127.0.0.1", portOf(router)],
      otherRouter: ["127.0.0.1", portOf(otherRouter)],
      earlierRouter: ["127.0.0.1", portOf(earlierRouter)],
      denied: ["192.0.2.1", 80],
      earlierDenied: ["198.51.100.1", 80],
      metadata: ["169.254.169.254", 80],
    });
    expect(seen).toEqual({
      hostService: "ECONNREFUSED",
      router: "connected",
      otherRouter: "connected",
      earlierRouter: "ECONNREFUSED",
      denied: "ECONNREFUSED",
      earlierDenied: "ECONNREFUSED",
      metadata: "ECONNREFUSED",
    });
    // The agent's own user is not fenced.
    expect(await connect("127.0.0.1", portOf(hostService))).toBe("connected");
  });

  it.skipIf(noSocketCgroups !== "")(`lets a replica through to its own port, and to no other replica's${noSocketCgroups}`, async () => {
    const logger = createLogger({ service: "tenant-fence-test", level: "silent" });
    const parent = (socketCgroups as { ok: true; cgroup: { version: 2; dir: string } }).cgroup;
    const [mine, theirs] = await Promise.all([createSocketCgroup(parent, `fence-test-a-${process.pid}`), createSocketCgroup(parent, `fence-test-b-${process.pid}`)]);
    const [myPort, theirPort, movedPort] = await Promise.all([listen(), listen(), listen()]);
    let own: OwnPort[] = [{ cgroup: theirs, port: portOf(theirPort) }];
    try {
      const kept = await keepTenantFence({ uid: TENANT.uid, routerPorts: [], deniedNets: [] }, logger, { ownPorts: () => own });
      try {
        await kept.renew();
        // A replica that starts is let through before it runs.
        await kept.openOwnPort({ cgroup: mine, port: portOf(myPort) });
        expect(await fromTenantCode({ mine: ["127.0.0.1", portOf(myPort)], theirs: ["127.0.0.1", portOf(theirPort)], hostService: ["127.0.0.1", portOf(hostService)] }, { cgroup: mine })).toEqual({
          mine: "connected",
          theirs: "ECONNREFUSED",
          hostService: "ECONNREFUSED",
        });
        // Tenant code in no replica's cgroup (a build, say) reaches neither.
        expect(await fromTenantCode({ mine: ["127.0.0.1", portOf(myPort)], theirs: ["127.0.0.1", portOf(theirPort)] })).toEqual({ mine: "ECONNREFUSED", theirs: "ECONNREFUSED" });
        // Renewals keep what the runtime names: the other replica reaches its own port.
        own = [{ cgroup: mine, port: portOf(myPort) }, { cgroup: theirs, port: portOf(theirPort) }];
        await kept.renew();
        expect(await fromTenantCode({ theirs: ["127.0.0.1", portOf(theirPort)], mine: ["127.0.0.1", portOf(myPort)] }, { cgroup: theirs })).toEqual({ theirs: "connected", mine: "ECONNREFUSED" });
        // A replica that comes back on another port (its own was taken while it was down) is let
        // through to the new one alone: the old one may be another replica's by now.
        await kept.openOwnPort({ cgroup: mine, port: portOf(movedPort) });
        expect(await fromTenantCode({ moved: ["127.0.0.1", portOf(movedPort)], before: ["127.0.0.1", portOf(myPort)] }, { cgroup: mine })).toEqual({ moved: "connected", before: "ECONNREFUSED" });
      } finally {
        kept.stop();
      }
      // A renewal replaces the rules in one transaction: a replica calling itself all along is never refused.
      const renewing = await keepTenantFence({ uid: TENANT.uid, routerPorts: [], deniedNets: [] }, logger, { ownPorts: () => own, renewMs: 5 });
      try {
        expect(await fromTenantCode({ mine: ["127.0.0.1", portOf(myPort)] }, { cgroup: mine, forMs: 2000 })).toEqual({ mine: "connected" });
      } finally {
        renewing.stop();
      }
    } finally {
      await Promise.all([myPort, theirPort, movedPort].map((s) => new Promise((r) => s.close(r))));
      await Promise.all([mine, theirs].map((dir) => removeCgroup(dir).catch(() => undefined)));
    }
  });

  it("keeps tenant code's broadcasts and multicasts from the host's listeners", async () => {
    const received: string[] = [];
    udp.on("message", (m) => received.push(String(m)));
    const port = (udp.address() as net.AddressInfo).port;
    const box = new Sandbox({ what: "tests", runAs: TENANT, hide: [] });
    const script = `
      const dgram = require("node:dgram");
      const s = dgram.createSocket("udp4");
      s.bind(0, () => {
        s.setBroadcast(true);
        const to = ["127.255.255.255", "255.255.255.255", "224.0.0.1", "127.0.0.1"];
        Promise.all(to.map((host) => new Promise((resolve) => s.send(host, ${port}, host, (err) => resolve([host, err ? err.code : "sent"])))))
          .then((r) => { console.log(JSON.stringify(Object.fromEntries(r))); s.close(); });
      });
    `;
    const { argv } = await box.wrap([process.execPath, "-e", script], { writable: [], chdir: "/", dieWithParent: true });
    const { stdout } = await run(argv[0]!, argv.slice(1));
    expect(JSON.parse(stdout)).toEqual({ "127.255.255.255": "EPERM", "255.255.255.255": "EPERM", "224.0.0.1": "EPERM", "127.0.0.1": "EPERM" });
    await new Promise((r) => setTimeout(r, 200));
    expect(received).toEqual([]);
  });

  it("lets only TCP through to a router's port: no datagram reaches a listener on its number", async () => {
    const listener = dgram.createSocket("udp4");
    await new Promise<void>((resolve) => listener.bind(portOf(router), "127.0.0.1", resolve));
    const received: string[] = [];
    listener.on("message", (m) => received.push(String(m)));
    try {
      const box = new Sandbox({ what: "tests", runAs: TENANT, hide: [] });
      const script = `
        const s = require("node:dgram").createSocket("udp4");
        s.send("hello", ${portOf(router)}, "127.0.0.1", (err) => { console.log(JSON.stringify({ udp: err ? err.code : "sent" })); s.close(); });
      `;
      const { argv } = await box.wrap([process.execPath, "-e", script], { writable: [], chdir: "/", dieWithParent: true });
      expect(JSON.parse((await run(argv[0]!, argv.slice(1))).stdout)).toEqual({ udp: "EPERM" });
      await new Promise((r) => setTimeout(r, 200));
      expect(received).toEqual([]);
      expect(await fromTenantCode({ router: ["127.0.0.1", portOf(router)] })).toEqual({ router: "connected" });
    } finally {
      listener.close();
    }
  });

  it("is put back when it is gone (a firewall reload flushes the ruleset)", async () => {
    const logger = createLogger({ service: "tenant-fence-test", level: "silent" });
    const kept = await keepTenantFence({ uid: TENANT.uid, routerPorts: [portOf(router)], deniedNets: [] }, logger, { renewMs: 100 });
    try {
      await run("nft", ["delete", "table", "inet", fenceTable(TENANT.uid)]);
      await expect.poll(async () => (await fromTenantCode({ hostService: ["127.0.0.1", portOf(hostService)] })).hostService, { timeout: 5_000 }).toBe("ECONNREFUSED");
    } finally {
      kept.stop();
    }
  });

  it("lets tenant code answer connections made to it (Caddy's requests, health checks)", async () => {
    const box = new Sandbox({ what: "tests", runAs: TENANT, hide: [] });
    const script = `
      const server = require("node:net").createServer((s) => s.end("from the tenant\\n"));
      server.listen(0, "127.0.0.1", () => console.log(server.address().port));
      setTimeout(() => process.exit(0), 5000);
    `;
    const { argv } = await box.wrap([process.execPath, "-e", script], { writable: [], chdir: "/", dieWithParent: true });
    const child = execFile(argv[0]!, argv.slice(1));
    try {
      const port = await new Promise<number>((resolve) => child.stdout!.once("data", (d) => resolve(Number(String(d).trim()))));
      const answer = await new Promise<string>((resolve, reject) => {
        const s = net.connect({ host: "127.0.0.1", port });
        let data = "";
        s.on("data", (d) => (data += String(d)));
        s.on("end", () => resolve(data));
        s.on("error", reject);
      });
      expect(answer).toBe("from the tenant\n");
    } finally {
      child.kill("SIGKILL");
    }
  });
});

/**
 * "Outside the host": a network namespace of its own joined to the host by a veth pair, so its
 * connections come in on an interface other than lo, as a remote client's would.
 */
async function outsideHost(): Promise<
  { hostAddress: string; farAddress: string; connect(port: number): Promise<string>; serve(): Promise<{ port: number; stop(): void }>; remove(): Promise<void> } | string
> {
  const id = `${process.pid % 10000}${Math.floor(Math.random() * 100)}`;
  const ns = `pft-${id}`;
  const [hostEnd, farEnd] = [`pfh${id}`, `pff${id}`];
  const octet = 1 + (Number(id) % 250);
  const [hostAddress, farAddress] = [`10.231.${octet}.1`, `10.231.${octet}.2`];
  const remove = async () => {
    await run("ip", ["link", "delete", hostEnd]).catch(() => undefined);
    await run("ip", ["netns", "delete", ns]).catch(() => undefined);
  };
  try {
    for (const args of [
      ["netns", "add", ns],
      ["link", "add", hostEnd, "type", "veth", "peer", "name", farEnd],
      ["link", "set", farEnd, "netns", ns],
      ["addr", "add", `${hostAddress}/30`, "dev", hostEnd],
      ["link", "set", hostEnd, "up"],
      ["netns", "exec", ns, "ip", "addr", "add", `${farAddress}/30`, "dev", farEnd],
      ["netns", "exec", ns, "ip", "link", "set", farEnd, "up"],
    ]) {
      await run("ip", args);
    }
  } catch (err) {
    await remove();
    return `no network namespace to stand for another machine: ${(err as Error).message.split("\n")[0]}`;
  }
  const connectFrom = async (port: number) => {
    const script = `const s = require("node:net").connect({ host: ${JSON.stringify(hostAddress)}, port: ${port}, timeout: 3000 }, () => { s.destroy(); console.log("connected"); });
      s.on("timeout", () => { s.destroy(); console.log("timeout"); }); s.on("error", (e) => console.log(e.code));`;
    return (await run("ip", ["netns", "exec", ns, process.execPath, "-e", script])).stdout.trim();
  };
  /** A server on the other machine, answering "far". */
  const serve = async () => {
    const script = `const server = require("node:net").createServer((s) => s.end("far")); server.listen(0, ${JSON.stringify(farAddress)}, () => console.log(server.address().port));`;
    const child = execFile("ip", ["netns", "exec", ns, process.execPath, "-e", script]);
    const port = await new Promise<number>((resolve) => child.stdout!.once("data", (d) => resolve(Number(String(d).trim()))));
    return { port, stop: () => void child.kill("SIGKILL") };
  };
  return { hostAddress, farAddress, connect: connectFrom, serve, remove };
}

const outside = skip === "" ? await outsideHost() : null;
const skipOutside = skip !== "" ? skip : typeof outside === "string" ? outside : "";
const noSlirp = (await findHostTool("slirp4netns")) ? "" : " (skipped: slirp4netns is not installed)";

describe.skipIf(skipOutside !== "")(`replica ports behind the fence${skipOutside ? ` (skipped: ${skipOutside})` : ""}`, () => {
  const other = typeof outside === "object" && outside ? outside : null;
  let replica: net.Server;
  let unguarded: net.Server;
  beforeAll(async () => {
    // On every address, as a replica listens.
    const listenEverywhere = async () => {
      const server = net.createServer((s) => s.on("error", () => undefined).end("hello\n"));
      await new Promise<void>((resolve) => server.listen(0, "0.0.0.0", resolve));
      return server;
    };
    [replica, unguarded] = await Promise.all([listenEverywhere(), listenEverywhere()]);
  });
  afterAll(async () => {
    await Promise.all([replica, unguarded].map((s) => new Promise((r) => s?.close(r))));
    await other?.remove();
    await run("nft", ["delete", "table", "inet", fenceTable(TENANT.uid)]).catch(() => undefined);
  });

  it("refuses connections from outside the host to a replica's port, from the moment it is guarded, and lets the host's own through", async () => {
    const logger = createLogger({ service: "tenant-fence-test", level: "silent" });
    const kept = await keepTenantFence({ uid: TENANT.uid, routerPorts: [], deniedNets: [] }, logger, { replicaPorts: () => [] });
    try {
      expect(await other!.connect(portOf(replica))).toBe("connected");
      await kept.guard(portOf(replica));
      expect(await other!.connect(portOf(replica))).toBe("ECONNREFUSED");
      // Another port of the host is no replica's; the host reaches the replica on any of its addresses (Caddy uses 127.0.0.1).
      expect(await other!.connect(portOf(unguarded))).toBe("connected");
      expect(await connect(other!.hostAddress, portOf(replica))).toBe("connected");
      expect(await connect("127.0.0.1", portOf(replica))).toBe("connected");
    } finally {
      kept.stop();
    }
  });

  it("keeps the ports the runtime names closed across renewals, and lets a gone replica's port go", async () => {
    const logger = createLogger({ service: "tenant-fence-test", level: "silent" });
    let ports = [portOf(unguarded)];
    const kept = await keepTenantFence({ uid: TENANT.uid, routerPorts: [], deniedNets: [] }, logger, { replicaPorts: () => ports, portTtlS: 2, renewMs: 500 });
    try {
      expect(await other!.connect(portOf(unguarded))).toBe("ECONNREFUSED");
      await new Promise((r) => setTimeout(r, 2500));
      expect(await other!.connect(portOf(unguarded))).toBe("ECONNREFUSED");
      ports = [];
      await expect.poll(() => other!.connect(portOf(unguarded)), { timeout: 5_000, interval: 500 }).toBe("connected");
    } finally {
      kept.stop();
    }
  });

  it.skipIf(noSlirp !== "")(`lets a build command in its own network reach other machines, fenced as the tenant user's own connections are${noSlirp}`, async () => {
    const logger = createLogger({ service: "tenant-fence-test", level: "silent" });
    const kept = await keepTenantFence({ uid: TENANT.uid, routerPorts: [], deniedNets: [] }, logger, { replicaPorts: () => [] });
    const far = await other!.serve();
    try {
      const seen = await fromTenantCode(
        {
          otherMachine: [other!.farAddress, far.port],
          // The host's own address: slirp4netns connects as the tenant user, and the fence holds.
          hostAddress: [other!.hostAddress, portOf(unguarded)],
          // The namespace's own loopback, where nothing of the host's listens.
          loopback: ["127.0.0.1", portOf(unguarded)],
        },
        { ownNetwork: true },
      );
      expect(seen.otherMachine).toBe("connected");
      expect(seen.hostAddress).not.toBe("connected");
      expect(seen.loopback).toBe("ECONNREFUSED");
    } finally {
      far.stop();
      kept.stop();
    }
  });
});
