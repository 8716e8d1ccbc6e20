/**
 * The bubblewrap sandbox tenant code runs in on a host: each replica of a deployed app
 * (runtime/process.ts) and each build command (builder.ts). The host's root is read-only, /tmp is
 * a private tmpfs, the agent's own files and the host's secrets (hostSecrets) are hidden, and only
 * the paths the code must write are bound writable. The process sees its own pid
 * namespace (no signal reaches the agent or another tenant's process) and no capability: the agent
 * may run as root, and root with CAP_SYS_ADMIN could remount the read-only root writable. The
 * network stays shared: a replica listens on 127.0.0.1 for Caddy, a build fetches its packages.
 *
 * Whether the host can sandbox is probed at run time; without bubblewrap (or the namespaces it
 * needs) tenant code runs unsandboxed and the agent says so in its log.
 */
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access, realpath, stat } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "@platform/logger";

const DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin";

export type SandboxProbe = { ok: true; bwrap: string } | { ok: false; reason: string };

async function findOnPath(name: string): Promise<string | null> {
  for (const dir of (process.env.PATH ?? DEFAULT_PATH).split(":")) {
    if (!dir) continue;
    const file = path.join(dir, name);
    if (await access(file, constants.X_OK).then(() => true, () => false)) return file;
  }
  return null;
}

/** Whether bubblewrap is installed and can create the namespaces a sandbox needs. */
export async function probeSandbox(): Promise<SandboxProbe> {
  const bwrap = await findOnPath("bwrap");
  if (!bwrap) return { ok: false, reason: "bwrap is not on PATH" };
  const args = sandboxArgs({ writable: [], chdir: "/", dieWithParent: true }, { dirs: [], files: [], readable: [] }).concat("--", "true");
  return new Promise((resolve) => {
    const child = spawn(bwrap, args, { stdio: ["ignore", "ignore", "pipe"], timeout: 10_000 });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => {
      if (stderr.length < 2000) stderr += chunk.toString("utf8");
    });
    child.once("error", (err) => resolve({ ok: false, reason: `bwrap could not be run: ${err.message}` }));
    child.once("close", (code, signal) => {
      if (code === 0) resolve({ ok: true, bwrap });
      else resolve({ ok: false, reason: `bwrap failed here (${signal ?? `exit code ${code}`}): ${stderr.trim() || "no output"}` });
    });
  });
}

export interface SandboxedCommand {
  /** Bound writable, in this order (a later path may lie within an earlier one). */
  writable: string[];
  /** The working directory of the command, inside the sandbox. */
  chdir: string;
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
export function sandboxArgs(cmd: SandboxedCommand, hidden: Hidden): string[] {
  return [
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--proc", "/proc",
    // The new /proc is the host kernel's: without a user namespace, uid 0 could write its settings.
    "--ro-bind", "/proc/sys", "/proc/sys",
    // Before the binds: a writable path may lie under /tmp or a hidden path, and must show through.
    "--tmpfs", "/tmp",
    ...hidden.dirs.flatMap((p) => ["--tmpfs", p]),
    ...hidden.files.flatMap((p) => ["--ro-bind", "/dev/null", p]),
    ...hidden.readable.flatMap((p) => ["--ro-bind", p, p]),
    ...cmd.writable.flatMap((p) => ["--bind", p, p]),
    "--unshare-pid",
    "--unshare-ipc",
    ...(cmd.dieWithParent ? ["--die-with-parent"] : []),
    "--cap-drop", "ALL",
    "--chdir", cmd.chdir,
  ];
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
}

/** One host's sandbox for one kind of tenant code: probed once, then wraps each command. */
export class Sandbox {
  readonly #hide: string[];
  readonly #mode: "auto" | "off";
  readonly #logger: Logger | undefined;
  readonly #what: string;
  #bwrap: Promise<string | null> | null = null;

  constructor(opts: SandboxOptions) {
    this.#hide = opts.hide.map((p) => path.resolve(p));
    this.#mode = opts.mode ?? "auto";
    this.#logger = opts.logger;
    this.#what = opts.what;
  }

  /** The bwrap binary, or null when commands run unsandboxed here. */
  ready(): Promise<string | null> {
    if (this.#mode === "off") return Promise.resolve(null);
    this.#bwrap ??= probeSandbox().then((probe) => {
      if (probe.ok) {
        this.#logger?.info({ bwrap: probe.bwrap }, `${this.#what} run sandboxed with bubblewrap`);
        return probe.bwrap;
      }
      this.#logger?.warn({ reason: probe.reason }, `${this.#what} run without a sandbox`);
      return null;
    });
    return this.#bwrap;
  }

  /** `argv` as run on this host: inside the sandbox when there is one. */
  async wrap(argv: string[], cmd: SandboxedCommand): Promise<{ argv: string[]; sandboxed: boolean }> {
    const bwrap = await this.ready();
    if (!bwrap) return { argv, sandboxed: false };
    return { argv: [bwrap, ...sandboxArgs(cmd, await this.#hidden()), "--", ...argv], sandboxed: true };
  }

  /**
   * The hidden paths that exist, by their real path (a link is not a mount point), directories
   * outermost only: a path inside another is hidden with it, and a sandbox cannot create a mount
   * point on the read-only root.
   */
  async #hidden(): Promise<Hidden> {
    const found = new Map<string, boolean>();
    for (const p of this.#hide) {
      const real = await realpath(p).catch(() => null);
      if (!real || real === "/") continue;
      const st = await stat(real).catch(() => null);
      if (st) found.set(real, st.isDirectory());
    }
    const dirs = [...found].filter(([, dir]) => dir).map(([p]) => p);
    const within = (p: string, q: string) => p !== q && p.startsWith(q.endsWith(path.sep) ? q : `${q}${path.sep}`);
    const inside = (p: string) => dirs.some((q) => within(p, q));
    const readable: string[] = [];
    for (const p of mustStayReadable()) {
      const real = await realpath(p).catch(() => null);
      // The sandbox's own /tmp covers the host's too.
      if (real && (inside(real) || within(real, "/tmp")) && (await stat(real).catch(() => null))) readable.push(real);
    }
    return {
      dirs: dirs.filter((p) => !inside(p)).sort(),
      files: [...found].filter(([p, dir]) => !dir && !inside(p)).map(([p]) => p).sort(),
      readable,
    };
  }
}
