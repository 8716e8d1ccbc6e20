/**
 * Caddy, the router of each host (ARCHITECTURE section 5). The agent drives it only through its
 * admin API; this starts one with nothing but that API, for the dev runner and for test fleets.
 * The agent adds its own server on the router port. Everything Caddy writes (certificate storage,
 * its output) stays under the data directory, never under $HOME.
 */
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import { lastLines, sleep, which } from "./exec.ts";
import { InfrastructureError, ensureBinaries, type InfraLog } from "./infrastructure.ts";
import { isPortFree } from "./ports.ts";

export interface StartCaddyOptions {
  /** Port of the admin API, on 127.0.0.1. */
  adminPort: number;
  /** Port the agent's router will serve apps on; it must be free. */
  httpPort: number;
  /** Caddy's config, storage and output (`caddy.log`) go here. */
  dataDir: string;
  log?: InfraLog;
  /** How long Caddy may take to answer on its admin API (default 30 s). */
  timeoutMs?: number;
}

export interface StartedCaddy {
  adminUrl: string;
  httpPort: number;
  pid: number;
  logFile: string;
  /** How it ended (`exited with code 0`, `was killed by SIGKILL`); undefined while it runs. */
  died(): string | undefined;
  /** SIGTERM, then SIGKILL after 5 s. Safe to call twice. */
  stop(): Promise<void>;
}

const STOP_GRACE_MS = 5000;

export function caddyBin(): string | undefined {
  return which("caddy", ["/usr/bin", "/usr/local/bin"]);
}

const MIGRATE_REQ = "/proc/sys/net/ipv4/tcp_migrate_req";

/**
 * Lets the kernel hand the connections queued on a closing listener to another listener of the
 * same port (net.ipv4.tcp_migrate_req, Linux 5.14 and later). Caddy 2.6 (Debian's) opens a new
 * SO_REUSEPORT listener on every config change and closes the old one; without this, the
 * connections still queued on the old one are reset, so a blue/green route flip could fail a
 * request or two (measured: 30 resets in 100 flips under load, none with it). Caddy 2.7 and later
 * keep their listener across a config change. Needs root; without it, the reason is logged.
 */
export function allowListenerMigration(log: InfraLog): void {
  try {
    if (fs.readFileSync(MIGRATE_REQ, "utf8").trim() === "1") return;
    fs.writeFileSync(MIGRATE_REQ, "1");
    log("set net.ipv4.tcp_migrate_req=1: a route change no longer resets the router's queued connections");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? String(err);
    log(`could not set net.ipv4.tcp_migrate_req=1 (${code}): a route change may reset a connection or two`);
  }
}

/** Whether a Caddy admin API answers at `adminUrl`. */
export async function probeCaddy(adminUrl: string, timeoutMs = 2000): Promise<boolean> {
  try {
    const res = await fetch(`${adminUrl.replace(/\/+$/, "")}/config/`, { signal: AbortSignal.timeout(timeoutMs) });
    await res.arrayBuffer();
    return res.ok;
  } catch {
    return false;
  }
}

export async function startCaddy(opts: StartCaddyOptions): Promise<StartedCaddy> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[caddy] ${line}\n`));
  const timeoutMs = opts.timeoutMs ?? 30_000;
  await ensureBinaries(["caddy"], log);
  const bin = caddyBin()!;
  for (const [port, what] of [
    [opts.adminPort, "Caddy's admin API (AGENT_ROUTER_ADMIN_URL)"],
    [opts.httpPort, "the router (PLATFORM_ROUTER_PORT)"],
  ] as const) {
    if (!(await isPortFree(port))) throw new InfrastructureError(`port ${port}, meant for ${what}, is already in use`);
  }

  allowListenerMigration(log);
  const dataDir = path.resolve(opts.dataDir);
  fs.mkdirSync(dataDir, { recursive: true });
  const configFile = path.join(dataDir, "caddy.json");
  const logFile = path.join(dataDir, "caddy.log");
  const adminUrl = `http://127.0.0.1:${opts.adminPort}`;
  const config = {
    // The agent re-asserts its routes when Caddy comes back empty; a saved copy would only go stale.
    admin: { listen: `127.0.0.1:${opts.adminPort}`, config: { persist: false } },
    storage: { module: "file_system", root: path.join(dataDir, "storage") },
  };
  fs.writeFileSync(configFile, `${JSON.stringify(config, null, 2)}\n`);

  log(`starting caddy, admin API ${adminUrl} (data ${dataDir}, log ${logFile})`);
  const out = fs.openSync(logFile, "a");
  // detached: the terminal's Ctrl-C reaches our runner, which stops things in order.
  const child = spawn(bin, ["run", "--config", configFile], {
    cwd: dataDir,
    detached: true,
    stdio: ["ignore", out, out],
    env: { ...process.env, XDG_DATA_HOME: path.join(dataDir, "data"), XDG_CONFIG_HOME: path.join(dataDir, "config") },
  });
  fs.closeSync(out);
  child.unref();
  let exit: string | undefined;
  const exited = new Promise<void>((resolve) => {
    child.once("error", (err) => {
      exit ??= `could not be run: ${err.message}`;
      resolve();
    });
    child.once("exit", (code, signal) => {
      exit ??= signal ? `was killed by ${signal}` : `exited with code ${code}`;
      resolve();
    });
  });

  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= (async () => {
      if (exit !== undefined) return;
      child.kill("SIGTERM");
      await Promise.race([exited, sleep(STOP_GRACE_MS)]);
      if (exit === undefined) {
        child.kill("SIGKILL");
        await exited;
      }
    })();
    return stopping;
  };

  const deadline = Date.now() + timeoutMs;
  while (!(await probeCaddy(adminUrl))) {
    if (exit !== undefined || Date.now() >= deadline) {
      const why = exit ?? `did not answer within ${Math.round(timeoutMs / 1000)} s`;
      await stop();
      const tail = lastLines(fs.readFileSync(logFile, "utf8"), 20);
      throw new InfrastructureError(`caddy at ${adminUrl} ${why}${tail ? `\n--- ${logFile} ---\n${tail}` : ""}`);
    }
    await sleep(100);
  }
  return { adminUrl, httpPort: opts.httpPort, pid: child.pid!, logFile, died: () => exit, stop };
}
