/**
 * The bubblewrap sandbox tenant code runs in on a host: each replica of a deployed app
 * (runtime/process.ts) and each build command (builder.ts). The host's root is read-only, /tmp is
 * a private tmpfs, the agent's own files and the platform's secrets are covered by empty tmpfs,
 * and only the paths the code must write are bound writable. The process sees its own pid
 * namespace (no signal reaches the agent or another tenant's process) and no capability: the agent
 * may run as root, and root with CAP_SYS_ADMIN could remount the read-only root writable. The
 * network stays shared: a replica listens on 127.0.0.1 for Caddy, a build fetches its packages.
 *
 * Whether the host can sandbox is probed at run time; without bubblewrap (or the namespaces it
 * needs) tenant code runs unsandboxed and the agent says so in its log.
 */
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access, stat } from "node:fs/promises";
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
  const args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-pid", "--unshare-ipc", "--cap-drop", "ALL", "true"];
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
 * The bubblewrap arguments of one command. No --new-session: the agent signals the command's
 * process group, which must still reach it, and the group's session (made by `detached`) has no
 * terminal that --new-session would protect.
 */
export function sandboxArgs(cmd: SandboxedCommand, hidden: string[]): string[] {
  return [
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--proc", "/proc",
    // Before the binds: a writable path may lie under /tmp or a hidden path, and must show through.
    "--tmpfs", "/tmp",
    ...hidden.flatMap((p) => ["--tmpfs", p]),
    ...cmd.writable.flatMap((p) => ["--bind", p, p]),
    "--unshare-pid",
    "--unshare-ipc",
    ...(cmd.dieWithParent ? ["--die-with-parent"] : []),
    "--cap-drop", "ALL",
    "--chdir", cmd.chdir,
  ];
}

export interface SandboxOptions {
  /** Paths the sandboxed code must not see: each is covered by an empty tmpfs. */
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
   * The hidden paths that exist (a tmpfs needs a mount point), outermost only: a path inside
   * another is hidden with it, and a sandbox cannot create a mount point on the read-only root.
   */
  async #hidden(): Promise<string[]> {
    const existing: string[] = [];
    for (const p of this.#hide) if (p !== "/" && (await stat(p).catch(() => null))?.isDirectory()) existing.push(p);
    const within = (p: string, q: string) => p !== q && p.startsWith(q.endsWith(path.sep) ? q : `${q}${path.sep}`);
    return [...new Set(existing)].filter((p) => !existing.some((q) => within(p, q))).sort();
  }
}
