/**
 * A network namespace of its own for a build command: its loopback is its own, so a build's
 * tests may serve on 127.0.0.1 and connect to themselves (Gradle's daemon, test suites, a
 * prerender against a local server), which the tenant fence refuses on the host's loopback; and
 * no listener of the host, nor of another tenant, is in sight of it. Outward connections (package
 * registries, git) go through slirp4netns, a user-mode TCP/IP stack that makes them as ordinary
 * sockets on the host, owned by the tenant user: the tenant fence (tenant-fence.ts) limits them
 * as it limits the tenant user's own, and slirp4netns's way to the host's loopback (10.0.2.2) is
 * turned off. DNS goes to slirp4netns's forwarder (10.0.2.3), which asks the host's resolver.
 *
 * Replicas keep the host's network: the router reaches them on the host's loopback, and a
 * user-mode stack on every proxied request would cost what the router exists to save.
 *
 * bubblewrap makes the namespace, reports the sandbox's pid on INFO_FD and waits on BLOCK_FD; the
 * agent opens the namespace (as root) and hands it to slirp4netns, which it starts as the tenant
 * user with only the three capabilities it needs to join the namespace, make its tap device and
 * open /dev/net/tun (root's alone), under its own seccomp filter. Not before bubblewrap has set up
 * the namespace's loopback: slirp4netns sets lo up too, and when it comes first the kernel gives
 * lo 127.0.0.1 before bubblewrap adds it, which bubblewrap takes for a failure ("loopback: Failed
 * RTM_NEWADDR"; about one command in a hundred failed so when the two raced). Not with --enable-sandbox: that
 * leaves it running with effective uid 0, and its sockets would be root's, past the fence. Tenant
 * code cannot reach the process: it lies outside every sandbox's pid namespace and Landlock
 * domain, and holds capabilities the tenant user lacks (no ptrace). When it is ready, the command
 * goes on. slirp4netns ends with the command (its exit fd closes).
 *
 * slirp4netns never passes a refused connection on (libslirp drops it quietly): the command's
 * SYN goes unanswered, and the kernel would try it again for about two minutes. The namespace's
 * own tcp_syn_retries is lowered to SYN_RETRIES first, so such a connection fails in about 20 s.
 * Between the command and slirp4netns nothing is lost, so the retries only ever wait on a slow
 * connect out there.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { open, readFile } from "node:fs/promises";
import type { Readable, Writable } from "node:stream";
import type { TenantUser } from "./sandbox.ts";
import { endedWith, runQuietly } from "./quiet-command.ts";

/** Where bubblewrap writes its JSON info (the sandbox's pid), and reads the go-ahead. Past fd 3, which the seccomp filter takes. */
export const INFO_FD = 5;
export const BLOCK_FD = 6;
/** slirp4netns's DNS forwarder, as --configure sets the namespace up. */
const SLIRP_DNS = "10.0.2.3";
/** How long slirp4netns may take to set the namespace up. */
const READY_TIMEOUT_MS = 10_000;
/** SYNs resent 3 times (at about 1, 3 and 7 s): a connect that nothing answers fails after about 20 s (19 s measured). */
const SYN_RETRIES = 3;

export interface OwnNetworkTool {
  slirp: string;
  setpriv: string;
  /** util-linux's nsenter, which sets the namespace's tcp_syn_retries. */
  nsenter: string;
  runAs: TenantUser;
  /** The resolv.conf bound over the sandbox's /etc/resolv.conf (null: the host has none). */
  resolvConf: string | null;
}

/** The host's resolv.conf with slirp4netns's forwarder for every name server (search and options kept). */
export async function ownResolvConf(hostFile = "/etc/resolv.conf"): Promise<string | null> {
  const host = await readFile(hostFile, "utf8").catch(() => null);
  if (host === null) return null;
  const kept = host.split("\n").filter((l) => !/^\s*nameserver\s/.test(l) && l.trim() !== "");
  return [`nameserver ${SLIRP_DNS}`, ...kept, ""].join("\n");
}

/** bubblewrap's arguments for a namespace of the command's own. */
export function ownNetworkArgs(tool: OwnNetworkTool): string[] {
  return ["--unshare-net", "--info-fd", String(INFO_FD), "--block-fd", String(BLOCK_FD), ...(tool.resolvConf ? ["--ro-bind", tool.resolvConf, "/etc/resolv.conf"] : [])];
}

/** The stdio of a command spawned with ownNetworkArgs: `base` for fds 0-2, pipes at INFO_FD and BLOCK_FD. */
export function ownNetworkStdio(base: Array<"ignore" | "pipe" | number>): Array<"ignore" | "pipe" | number> {
  const stdio: Array<"ignore" | "pipe" | number> = [...base];
  while (stdio.length < BLOCK_FD + 1) stdio.push("ignore");
  stdio[INFO_FD] = "pipe";
  stdio[BLOCK_FD] = "pipe";
  return stdio;
}

/** The sandbox's pid from bubblewrap's info (`{"child-pid": N}`), once it is whole. */
function sandboxPid(info: Readable): Promise<number> {
  return new Promise((resolve, reject) => {
    let text = "";
    const done = (err?: Error, pid?: number) => {
      info.off("data", onData);
      info.off("end", onEnd);
      if (err) reject(err);
      else resolve(pid!);
    };
    const onData = (chunk: Buffer) => {
      text += chunk.toString("utf8");
      const match = /"child-pid"\s*:\s*(\d+)/.exec(text);
      if (match) done(undefined, Number(match[1]));
    };
    const onEnd = () => done(new Error("bubblewrap ended before it made the sandbox"));
    info.on("data", onData);
    info.on("end", onEnd);
  });
}

/**
 * Resolves once bubblewrap has given the namespace of sandbox `pid` its loopback: 127.0.0.0/8
 * routed, which the kernel does when lo has its address and is up.
 */
export async function loopbackReady(pid: number, bwrap: ChildProcess): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    const routes = await readFile(`/proc/${pid}/net/fib_trie`, "utf8").catch(() => "");
    if (routes.includes("/8 host LOCAL")) return;
    if (bwrap.exitCode !== null || bwrap.signalCode !== null) throw new Error("bubblewrap ended before it set up the sandbox's loopback");
    if (Date.now() > deadline) throw new Error(`bubblewrap did not set up the sandbox's loopback within ${READY_TIMEOUT_MS / 1000} s`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

/**
 * Gives the command spawned with ownNetworkArgs/ownNetworkStdio its network, then lets it run.
 * Rejects when it cannot (the command still waits: the caller ends it).
 */
export async function attachOwnNetwork(child: ChildProcess, tool: OwnNetworkTool): Promise<void> {
  const stdio = child.stdio as ReadonlyArray<Readable | Writable | null | undefined>;
  const info = stdio[INFO_FD] as Readable;
  const go = stdio[BLOCK_FD] as Writable;
  const pid = await sandboxPid(info);
  info.resume();
  await loopbackReady(pid, child);
  // Set while slirp4netns starts: the command waits for both.
  const tuning = runQuietly(tool.nsenter, [`--net=/proc/${pid}/ns/net`, "--", "/bin/sh", "-c", `echo ${SYN_RETRIES} > /proc/sys/net/ipv4/tcp_syn_retries`], { timeoutMs: READY_TIMEOUT_MS }).catch(
    (err: Error) => err,
  );
  const ns = await open(`/proc/${pid}/ns/net`, "r");
  let slirp: ChildProcess;
  try {
    const caps = "+sys_admin,+net_admin,+dac_override";
    slirp = spawn(
      tool.setpriv,
      [
        `--reuid=${tool.runAs.uid}`, `--regid=${tool.runAs.gid}`, "--clear-groups", `--inh-caps=${caps}`, `--ambient-caps=${caps}`, `--bounding-set=-all,${caps}`, "--",
        tool.slirp, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-seccomp",
        "--ready-fd=3", "--exit-fd=4", "--netns-type=path", "/proc/self/fd/5", "tap0",
      ],
      { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe", ns.fd] },
    );
  } finally {
    await ns.close();
  }
  // The exit fd's write end is the agent's: it closes when the command ends, or the agent does.
  const exitFd = slirp.stdio[4] as Writable;
  exitFd.on("error", () => undefined);
  child.once("exit", () => exitFd.destroy());
  // Ended already (killed by a cancel or the build's time limit while this was awaited): its exit
  // event has gone by, and slirp4netns would outlive it.
  if (child.exitCode !== null || child.signalCode !== null) exitFd.destroy();
  let stderr = "";
  slirp.stderr!.on("data", (c: Buffer) => {
    if (stderr.length < 4096) stderr += c.toString("utf8");
  });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => fail(`slirp4netns was not ready within ${READY_TIMEOUT_MS / 1000} s`), READY_TIMEOUT_MS);
    const fail = (why: string) => {
      clearTimeout(timer);
      slirp.kill("SIGKILL");
      reject(new Error(why));
    };
    (slirp.stdio[3] as Readable).once("data", () => {
      clearTimeout(timer);
      resolve();
    });
    slirp.once("error", (err) => fail(`slirp4netns could not be run: ${err.message}`));
    slirp.once("exit", (code, signal) => fail(`slirp4netns ended (${signal ?? `exit code ${code}`}) before the network was up: ${stderr.trim() || "no output"}`));
  });
  const tuned = await tuning;
  if (tuned instanceof Error) throw new Error(`the namespace's tcp_syn_retries could not be set: ${tuned.message}`);
  if (tuned.code !== 0) throw new Error(`the namespace's tcp_syn_retries could not be set (${endedWith(tuned)}): ${tuned.stderr.trim() || "no output"}`);
  go.on("error", () => undefined);
  go.end("1");
}
