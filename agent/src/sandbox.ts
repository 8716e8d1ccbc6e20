/**
 * The bubblewrap sandbox tenant code runs in on a host: each replica of a deployed app
 * (runtime/process.ts) and each build command (builder.ts). The host's root is read-only, /tmp is
 * a private tmpfs, the agent's own files and the host's secrets (hostSecrets) are hidden, and only
 * the paths the code must write are bound writable. The process sees its own pid
 * namespace (no signal reaches the agent or another tenant's process) and no capability: the agent
 * may run as root, and root with CAP_SYS_ADMIN could remount the read-only root writable.
 *
 * Tenant code runs as the tenant user (AGENT_TENANT_UID), not as the agent's: bubblewrap sets the
 * sandbox up as root, then `setpriv` drops to the tenant user, with no new privileges (a setuid
 * binary cannot lift it back). The host's files only root may read stay unread, what the code
 * must write is handed over to the tenant user (handOver), and the tenant fence (tenant-fence.ts)
 * can tell its connections from everyone else's. A seccomp filter (seccomp.ts) keeps it from
 * creating user namespaces, and a Landlock scope (landlock.ts) from abstract unix sockets and
 * signals outside its sandbox. It runs at a lower CPU priority (TENANT_NICENESS) than the platform
 * on the same host, which it cannot raise back, so a tenant spinning every core slows other
 * tenants' code, not the agent, Postgres or NATS. A replica shares the host's network: it listens on its PORT for
 * Caddy. A build command gets a network namespace of its own where the host can make one
 * (own-network.ts), and the host's otherwise.
 *
 * Whether the host can sandbox is probed at run time; without bubblewrap (or the namespaces it
 * needs) tenant code runs unsandboxed, and without setpriv as the agent's user; the agent says so
 * in its log.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { rmSync } from "node:fs";
import { chmod, lchown, lstat, mkdtemp, readdir, realpath, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Logger } from "@platform/logger";
import { endedWith, findHostTool, findOnPath, runQuietly } from "./quiet-command.ts";
import { bindArgument, landlockScope } from "./landlock.ts";
import { sandboxFilter } from "./seccomp.ts";
import { attachOwnNetwork, ownNetworkArgs, ownNetworkStdio, ownResolvConf, type OwnNetworkTool } from "./own-network.ts";

/** The unprivileged user tenant code runs as. */
export interface TenantUser {
  uid: number;
  gid: number;
}

/** How a sandboxed command becomes the tenant user. */
export interface SandboxUser {
  setpriv: string;
  runAs: TenantUser;
}

/**
 * The nice value tenant code starts with: the kernel weighs a nice-10 process at about a tenth
 * of a nice-0 one when the CPU is contended, and lends it every idle cycle otherwise.
 */
export const TENANT_NICENESS = 10;

/**
 * `user`: how commands become the tenant user, null when they run as the agent's own (with
 * `userProblem` saying why, when the tenant user was asked for). `seccomp`: the file of the
 * seccomp filter (seccomp.ts) commands run under, null when none could be used (`seccompProblem`).
 * `scope`: the prefix that puts a command in a Landlock domain of its own (landlock.ts; the ports
 * it may bind, bindArgument, come next), empty when it cannot be done here (`scopeProblem`).
 * `lower`: the prefix that starts it at TENANT_NICENESS, empty without `nice` on PATH.
 */
export type SandboxProbe =
  | { ok: true; bwrap: string; user: SandboxUser | null; userProblem?: string; seccomp: string | null; seccompProblem?: string; scope: string[]; scopeProblem?: string; lower: string[] }
  | { ok: false; reason: string };

/**
 * The command line that starts bubblewrap with `args`. With a seccomp filter, a shell first opens
 * it as fd 3, where `--seccomp 3` reads it (bubblewrap closes it before the command runs).
 */
function launch(bwrap: string, seccomp: string | null, args: string[]): string[] {
  return seccomp ? ["/bin/sh", "-c", 'exec 3<"$0" && exec "$@"', seccomp, bwrap, ...args] : [bwrap, ...args];
}

let filesDir: Promise<string> | null = null;

/** The files sandboxes are made with, written once per process to a directory of its own (removed at exit). */
function sandboxFile(name: string, content: string | Buffer, mode: number): Promise<string> {
  filesDir ??= mkdtemp(path.join(os.tmpdir(), "platform-sandbox-")).then((dir) => {
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
    return dir;
  });
  return filesDir.then(async (dir) => {
    const file = path.join(dir, name);
    await writeFile(file, content, { mode });
    return file;
  });
}

let seccompFile: Promise<string | null> | null = null;

/** The seccomp filter, written once per process. */
function writeSeccompFilter(): Promise<string | null> {
  seccompFile ??= (async () => {
    const filter = sandboxFilter();
    return filter ? sandboxFile("sandbox.bpf", filter, 0o600) : null;
  })();
  return seccompFile;
}

/**
 * How build commands get a network namespace of their own here, or why they cannot: tried once,
 * with `true` in a sandbox such as theirs.
 */
async function probeOwnNetwork(host: SandboxHost & { user: SandboxUser }): Promise<{ tool: OwnNetworkTool } | { problem: string }> {
  const slirp = await findHostTool("slirp4netns");
  if (!slirp) return { problem: "slirp4netns is not installed" };
  const nsenter = await findHostTool("nsenter");
  if (!nsenter) return { problem: "nsenter (util-linux) is not on PATH" };
  const resolv = await ownResolvConf();
  const tool: OwnNetworkTool = { slirp, nsenter, setpriv: host.user.setpriv, runAs: host.user.runAs, resolvConf: resolv === null ? null : await sandboxFile("resolv.conf", resolv, 0o644) };
  const argv = sandboxedArgv(host, { writable: [], chdir: "/", dieWithParent: true }, { dirs: [], files: [], readable: [] }, tool, ["/bin/sh", "-c", "grep -q tap0: /proc/net/dev"]);
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ownNetworkStdio(["ignore", "ignore", "pipe"]) });
  let stderr = "";
  child.stderr!.on("data", (c: Buffer) => (stderr += c.toString("utf8")));
  const exited = new Promise<number | null>((resolve) => {
    child.once("error", () => resolve(null));
    child.once("exit", (code) => resolve(code));
  });
  const attached = await attachOwnNetwork(child, tool).then(() => null, (err: Error) => err.message);
  if (attached) child.kill("SIGKILL");
  const code = await exited;
  if (attached) return { problem: attached };
  return code === 0 ? { tool } : { problem: `a sandbox with its own network failed here (exit code ${code}): ${stderr.trim() || "no output"}` };
}

/** Runs bubblewrap with `args`; null when it exited 0, else what went wrong. */
async function tryBwrap(bwrap: string, seccomp: string | null, args: string[]): Promise<string | null> {
  const [file, ...rest] = launch(bwrap, seccomp, args);
  const ran = await runQuietly(file!, rest, { timeoutMs: 10_000 }).catch((err: Error) => err);
  if (ran instanceof Error) return `bwrap could not be run: ${ran.message}`;
  return ran.code === 0 ? null : `bwrap failed here (${endedWith(ran)}): ${ran.stderr || "no output"}`;
}

/**
 * Whether bubblewrap is installed and can create the namespaces a sandbox needs, whether the
 * command in it can become `runAs`, and whether it can run under the seccomp filter.
 */
export async function probeSandbox(runAs: TenantUser | null = null): Promise<SandboxProbe> {
  const bwrap = await findOnPath("bwrap");
  if (!bwrap) return { ok: false, reason: "bwrap is not on PATH" };
  const probe = (user: SandboxUser | null, seccomp: string | null, scope: string[] = []) =>
    tryBwrap(bwrap, seccomp, [...sandboxArgs({ writable: [], chdir: "/", dieWithParent: true }, { dirs: [], files: [], readable: [] }, user, seccomp !== null), "--", ...asUser(user), ...scope, ...(scope.length > 0 ? [bindArgument([1])] : []), "true"]);
  const failed = await probe(null, null);
  if (failed) return { ok: false, reason: failed };
  let user: SandboxUser | null = null;
  let userProblem: string | undefined;
  if (runAs) {
    const setpriv = await findOnPath("setpriv");
    userProblem = setpriv ? ((await probe({ setpriv, runAs }, null)) ?? undefined) : "setpriv (util-linux) is not on PATH";
    if (setpriv && !userProblem) user = { setpriv, runAs };
  }
  const filter = await writeSeccompFilter();
  const seccompProblem = filter ? await probe(user, filter) : `no seccomp filter is written for ${process.arch}`;
  const seccomp = seccompProblem ? null : filter;
  const shim = await landlockScope();
  const nice = await findOnPath("nice");
  // Landlock needs no_new_privs, which only the drop to the tenant user sets.
  const scopeProblem = !user ? "commands do not run as the tenant user" : !shim ? "python3 is not on the system PATH" : await probe(user, seccomp, shim);
  return {
    ok: true,
    bwrap,
    user,
    userProblem,
    seccomp,
    ...(seccompProblem ? { seccompProblem } : {}),
    scope: scopeProblem ? [] : shim!,
    ...(scopeProblem ? { scopeProblem } : {}),
    lower: nice ? [nice, "-n", String(TENANT_NICENESS)] : [],
  };
}

/** The prefix that makes a command run as the tenant user, with no way back to the agent's. */
function asUser(user: SandboxUser | null): string[] {
  if (!user) return [];
  return [user.setpriv, `--reuid=${user.runAs.uid}`, `--regid=${user.runAs.gid}`, "--clear-groups", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"];
}

export interface SandboxedCommand {
  /** Bound writable, in this order (a later path may lie within an earlier one). */
  writable: string[];
  /** The working directory of the command, inside the sandbox. */
  chdir: string;
  /**
   * A network namespace of its own (own-network.ts), where the host can make one: a build
   * command's. Its spawn must then use the stdio and attach of `wrap`'s `network`.
   */
  ownNetwork?: boolean;
  /**
   * The TCP ports the command may bind when it shares the host's network (Landlock, landlock.ts):
   * a replica's PORT, none for a build. Absent: any.
   */
  bindPorts?: number[];
  /**
   * The cgroups the command runs in: of the host's cgroup tree, the only ones it sees (read-only,
   * as its runtime reads its own limits there). The rest is hidden: the other replicas' and builds'
   * cgroups are named after their groups and apps, and show what they use.
   */
  cgroups?: string[];
  /**
   * Whether the command dies with the agent. A build does (the agent that would collect its
   * output is gone); a replica must outlive the agent, so it does not.
   */
  dieWithParent: boolean;
}

/**
 * What the sandbox covers: a directory by an empty tmpfs; a file or socket by /dev/null, which the
 * sandbox's nodev binds make unopenable (EACCES): nothing to read, nothing to connect to.
 */
export interface Hidden {
  dirs: string[];
  files: string[];
  /** Paths inside a hidden directory or /tmp that must still be read (see mustStayReadable). */
  readable: string[];
}

/**
 * The bubblewrap arguments of one command. No --new-session: the agent signals the command's
 * process group, which must still reach it, and the group's session (made by `detached`) has no
 * terminal that --new-session would protect.
 */
export function sandboxArgs(cmd: SandboxedCommand, hidden: Hidden, user: { runAs: TenantUser } | null = null, seccomp = false): string[] {
  return [
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    // Shared memory (shm_open, Python's multiprocessing locks) is everyone's, as on a host.
    "--perms", "1777", "--tmpfs", "/dev/shm",
    "--proc", "/proc",
    // The new /proc is the host kernel's: without a user namespace, uid 0 could write its settings.
    "--ro-bind", "/proc/sys", "/proc/sys",
    // Before the binds: a writable path may lie under /tmp or a hidden path, and must show through.
    // Everyone's, as a host's /tmp is: the tenant user writes there too.
    "--perms", "1777", "--tmpfs", "/tmp",
    ...hidden.dirs.flatMap((p) => ["--tmpfs", p]),
    ...hidden.files.flatMap((p) => ["--ro-bind", "/dev/null", p]),
    ...openParents([...hidden.readable, ...cmd.writable], ["/tmp", ...hidden.dirs]).flatMap((p) => ["--perms", "0755", "--dir", p]),
    ...hidden.readable.flatMap((p) => ["--ro-bind", p, p]),
    ...cmd.writable.flatMap((p) => ["--bind", p, p]),
    "--unshare-pid",
    "--unshare-ipc",
    ...(cmd.dieWithParent ? ["--die-with-parent"] : []),
    "--cap-drop", "ALL",
    // Only for setpriv's drop to the tenant user, which ends every capability, the bounding set's
    // too (as root, bubblewrap leaves that set whole).
    ...(user ? ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"] : []),
    // No user namespaces (seccomp.ts): the filter is read from fd 3 (see launch).
    ...(seccomp ? ["--seccomp", "3"] : []),
    "--chdir", cmd.chdir,
  ];
}

/**
 * The directories above `paths` that lie within the sandbox's own tmpfs mounts (`covered`), which
 * bubblewrap would make for the binds as root's alone: made beforehand, open to everyone, so the
 * tenant user can walk down to what is bound for it.
 */
function openParents(paths: string[], covered: string[]): string[] {
  const within = (p: string, q: string) => p.startsWith(q.endsWith(path.sep) ? q : `${q}${path.sep}`);
  const parents = new Set<string>();
  for (const p of paths) {
    for (let dir = path.dirname(p); dir !== path.dirname(dir); dir = path.dirname(dir)) {
      if (covered.some((c) => within(dir, c))) parents.add(dir);
    }
  }
  return [...parents].sort((a, b) => a.split(path.sep).length - b.split(path.sep).length || a.localeCompare(b));
}

/**
 * What tenant code must still read where the sandbox hides things: name resolution
 * (systemd-resolved's resolv.conf is a link into /run), and the node the agent runs on, which
 * tenant code finds first on its PATH (a checkout under /tmp or a hidden home keeps it there).
 */
function mustStayReadable(): string[] {
  return ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", path.dirname(process.execPath)];
}

/** Within a home directory, what holds credentials: hidden when the whole home cannot be. */
const HOME_CREDENTIALS = [
  ".ssh", ".gnupg", ".netrc", ".git-credentials", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc", ".pgpass",
  ".aws", ".azure", ".config", ".docker", ".kube", ".cargo/credentials", ".cargo/credentials.toml",
];

/**
 * What of the host tenant code must not reach besides the agent's own directories:
 * - the agent's home (git's ssh keys, registry tokens): all of it, unless the programs tenant code
 *   runs live there (a PATH directory or node itself), in which case its credential files;
 * - /run, where the host's services keep their sockets (Postgres trusts local connections, a
 *   Docker socket is root on the host); the tmpfs leaves no socket to connect to;
 * - the Docker socket the agent is configured with, wherever it is.
 */
export function hostSecrets(opts: { home: string; pathDirs: string[]; execPath: string; dockerSocket?: string }): string[] {
  const home = path.resolve(opts.home);
  const within = (p: string) => p === home || p.startsWith(`${home}${path.sep}`);
  const needed = [...opts.pathDirs.filter((d) => path.isAbsolute(d)), path.dirname(opts.execPath)].some((p) => within(path.resolve(p)));
  const homePaths = home === "/" ? [] : needed ? HOME_CREDENTIALS.map((f) => path.join(home, f)) : [home];
  return [...homePaths, "/run", ...(opts.dockerSocket ? [opts.dockerSocket] : [])];
}

export interface SandboxOptions {
  /** Paths the sandboxed code must not reach: a directory reads as empty, a file or socket cannot be opened. */
  hide: string[];
  mode?: "auto" | "off";
  logger?: Logger;
  /** What runs in it, for the agent's log: "replicas", "build commands". */
  what: string;
  /** The user sandboxed commands run as; null or absent: the agent's own. */
  runAs?: TenantUser | null;
}

/** A host's sandbox as probed: the bwrap to run, and the tenant user when commands drop to it. */
interface SandboxHost {
  bwrap: string;
  user: SandboxUser | null;
  seccomp: string | null;
  scope: string[];
  /** The prefix that lowers the command's CPU priority (TENANT_NICENESS); empty without `nice`. */
  lower: string[];
}

/** `argv` in the host's sandbox: bubblewrap (with a network of its own when `tool`), then a lower CPU priority, the tenant user and the Landlock scope. */
function sandboxedArgv(host: SandboxHost, cmd: SandboxedCommand, hidden: Hidden, tool: OwnNetworkTool | null, argv: string[]): string[] {
  const args = [...sandboxArgs(cmd, hidden, host.user, host.seccomp !== null), ...(tool ? ownNetworkArgs(tool) : [])];
  // In a network of its own, a command binds what it likes: no port of the host's is there.
  const scope = host.scope.length > 0 ? [...host.scope, bindArgument(tool ? undefined : cmd.bindPorts)] : [];
  return launch(host.bwrap, host.seccomp, [...args, "--", ...host.lower, ...asUser(host.user), ...scope, ...argv]);
}

/** How to spawn a command wrapped with a network of its own: its stdio, and what to do once it is spawned. */
export interface OwnNetwork {
  stdio(base: Array<"ignore" | "pipe" | number>): Array<"ignore" | "pipe" | number>;
  /** Gives the spawned command its network and lets it run; rejects when it cannot (the caller ends the command). */
  attach(child: ChildProcess): Promise<void>;
}

/** The host's cgroup tree, hidden in the sandbox but for the command's own cgroups. */
const CGROUP_ROOT = "/sys/fs/cgroup";

/** One host's sandbox for one kind of tenant code: probed once, then wraps each command. */
export class Sandbox {
  readonly #hide: string[];
  readonly #mode: "auto" | "off";
  readonly #logger: Logger | undefined;
  readonly #what: string;
  readonly #runAs: TenantUser | null;
  #host: Promise<SandboxHost | null> | null = null;
  #network: Promise<OwnNetworkTool | null> | null = null;

  constructor(opts: SandboxOptions) {
    this.#hide = opts.hide.map((p) => path.resolve(p));
    this.#mode = opts.mode ?? "auto";
    this.#logger = opts.logger;
    this.#what = opts.what;
    this.#runAs = opts.runAs ?? null;
  }

  /** The host's sandbox, or null when commands run unsandboxed here. */
  ready(): Promise<SandboxHost | null> {
    if (this.#mode === "off") return Promise.resolve(null);
    this.#host ??= probeSandbox(this.#runAs).then((probe) => {
      if (!probe.ok) {
        this.#logger?.warn({ reason: probe.reason }, `${this.#what} run without a sandbox`);
        return null;
      }
      const { bwrap, user, seccomp, scope, lower } = probe;
      if (user) this.#logger?.info({ bwrap, uid: user.runAs.uid }, `${this.#what} run sandboxed with bubblewrap, as the tenant user`);
      else if (probe.userProblem) this.#logger?.warn({ bwrap, reason: probe.userProblem }, `${this.#what} run sandboxed with bubblewrap, but as the agent's own user`);
      else this.#logger?.info({ bwrap }, `${this.#what} run sandboxed with bubblewrap`);
      if (probe.seccompProblem) this.#logger?.warn({ reason: probe.seccompProblem }, `${this.#what} may create user namespaces, share ports and use the kernel keyring (no seccomp filter)`);
      if (probe.scopeProblem && user) this.#logger?.warn({ reason: probe.scopeProblem }, `${this.#what} may reach the host's abstract unix sockets (no Landlock scope)`);
      if (lower.length === 0) this.#logger?.warn(`${this.#what} run at the platform's CPU priority (nice is not on PATH)`);
      return { bwrap, user, seccomp, scope, lower };
    });
    return this.#host;
  }

  /** The user sandboxed commands run as here; null: the agent's own. */
  async runsAs(): Promise<TenantUser | null> {
    return (await this.ready())?.user?.runAs ?? null;
  }

  /** How build commands get a network of their own here; null: they share the host's (and why is logged once). */
  #ownNetwork(host: SandboxHost): Promise<OwnNetworkTool | null> {
    this.#network ??= (async () => {
      const probed = host.user ? await probeOwnNetwork({ ...host, user: host.user }) : { problem: "commands do not run as the tenant user" };
      if ("tool" in probed) {
        this.#logger?.info({ slirp4netns: probed.tool.slirp }, `${this.#what} run with a network namespace of their own`);
        return probed.tool;
      }
      this.#logger?.warn({ reason: probed.problem }, `${this.#what} share the host's network: a command's own listeners on 127.0.0.1 are fenced off from it`);
      return null;
    })();
    return this.#network;
  }

  /** `argv` as run on this host: inside the sandbox when there is one. `network` says how to spawn it when it has its own. */
  async wrap(argv: string[], cmd: SandboxedCommand): Promise<{ argv: string[]; sandboxed: boolean; network: OwnNetwork | null }> {
    const host = await this.ready();
    if (!host) return { argv, sandboxed: false, network: null };
    const hidden = await this.#hidden(cmd.writable, host.user !== null, cmd.cgroups ?? []);
    const tool = cmd.ownNetwork ? await this.#ownNetwork(host) : null;
    const network = tool ? { stdio: ownNetworkStdio, attach: (child: ChildProcess) => attachOwnNetwork(child, tool) } : null;
    return { argv: sandboxedArgv(host, cmd, hidden, tool, argv), sandboxed: true, network };
  }

  /**
   * Makes `paths` (whole trees) the tenant user's, when commands run as it: what the command must
   * write (a checkout, a release, a home). A tree whose top the tenant user owns already was handed
   * over before. Links are changed themselves, never followed, so a tree cannot hand over a file
   * of the host's. A no-op when commands run as the agent's user.
   */
  async handOver(paths: string[]): Promise<void> {
    const runAs = await this.runsAs();
    if (!runAs) return;
    const trees: string[] = [];
    for (const p of paths) {
      const st = await lstat(p);
      if (st.uid === runAs.uid) continue;
      // Enterable by anyone, whatever the agent's umask made it: bubblewrap, as root without its
      // capabilities, changes into it before the drop to the tenant user.
      if (st.isDirectory()) await chmod(p, (st.mode & 0o7777) | 0o711);
      // A file or an empty directory (a new HOME) needs no chown process.
      if (!st.isDirectory() || (await readdir(p)).length === 0) await lchown(p, runAs.uid, runAs.gid);
      else trees.push(p);
    }
    if (trees.length === 0) return;
    const chown = await runQuietly("chown", ["-R", "-h", "-P", `${runAs.uid}:${runAs.gid}`, "--", ...trees]);
    if (chown.code !== 0) throw new Error(`chown failed (${endedWith(chown)}): ${chown.stderr}`);
  }

  /**
   * The hidden paths that exist, by their real path (a link is not a mount point), directories
   * outermost only: a path inside another is hidden with it, and a sandbox cannot create a mount
   * point on the read-only root. For the tenant user, a directory only root may enter on the way
   * to what it must reach (`reach`: its writable paths, and what must stay readable) is hidden
   * too: the tenant user could not walk through it, and what it holds is private to root anyway.
   */
  async #hidden(reach: string[], asTenant: boolean, cgroups: string[]): Promise<Hidden> {
    const found = new Map<string, boolean>();
    for (const p of [...this.#hide, CGROUP_ROOT]) {
      const real = await realpath(p).catch(() => null);
      if (!real || real === "/") continue;
      const st = await stat(real).catch(() => null);
      if (st) found.set(real, st.isDirectory());
    }
    const candidates: string[] = [];
    for (const p of [...mustStayReadable(), ...cgroups]) {
      const real = await realpath(p).catch(() => null);
      if (real && (await stat(real).catch(() => null))) candidates.push(real);
    }
    if (asTenant) for (const dir of await closedParents([...candidates, ...reach])) found.set(dir, true);
    const dirs = [...found].filter(([, dir]) => dir).map(([p]) => p);
    const within = (p: string, q: string) => p !== q && p.startsWith(q.endsWith(path.sep) ? q : `${q}${path.sep}`);
    const inside = (p: string) => dirs.some((q) => within(p, q));
    return {
      dirs: dirs.filter((p) => !inside(p)).sort(),
      files: [...found].filter(([p, dir]) => !dir && !inside(p)).map(([p]) => p).sort(),
      // The sandbox's own /tmp covers the host's too.
      readable: candidates.filter((p) => inside(p) || within(p, "/tmp")),
    };
  }
}

/** The directories above `paths` that others may not enter (no execute bit for them). */
async function closedParents(paths: string[]): Promise<string[]> {
  const closed = new Set<string>();
  for (const p of paths) {
    for (let dir = path.dirname(path.resolve(p)); dir !== path.dirname(dir); dir = path.dirname(dir)) {
      const st = await stat(dir).catch(() => null);
      if (st && (st.mode & 0o001) === 0) closed.add(dir);
    }
  }
  return [...closed];
}
