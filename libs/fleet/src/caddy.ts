/**
 * Caddy, the router of each host (ARCHITECTURE section 5). The agent drives it only through its
 * admin API; this starts one with nothing but that API, for the dev runner and for test fleets.
 * The agent adds its own server on the router port. Everything Caddy writes (certificate storage,
 * its output) stays under the data directory, never under $HOME.
 */
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { spawn } from "node:child_process";
import { lastLines, sleep, which } from "./exec.ts";
import { InfrastructureError, ensureBinaries, type InfraLog } from "./infrastructure.ts";
import { isPortFree } from "./ports.ts";

export interface StartCaddyOptions {
  /** Port of the admin API, on 127.0.0.1; or else... */
  adminPort?: number;
  /**
   * ...the admin API on this unix socket (its directory is created). A host running tenant code
   * wants this: a TCP port on 127.0.0.1 is open to every process of the host, and whoever
   * reaches the admin API rewrites the routes of every app (and Caddy, as root, serves files).
   */
  adminSocket?: string;
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

/** The admin API's URL for a unix socket (AGENT_ROUTER_ADMIN_URL accepts it as well as http://). */
export function adminSocketUrl(socket: string): string {
  return `unix://${path.resolve(socket)}`;
}

/**
 * One request to a Caddy admin API at `adminUrl`: `http://host:port` or `unix:///path/to/socket`.
 * A new connection each time: Caddy closes its admin connections when it loads a config, and
 * one kept alive across that would fail the next request.
 */
export function caddyAdmin(adminUrl: string, method: string, urlPath: string, opts: { body?: string; timeoutMs: number }): Promise<{ status: number; text: string }> {
  const url = new URL(adminUrl);
  const target: http.RequestOptions =
    url.protocol === "unix:"
      ? // Caddy takes only an empty Host on a socket (it checks Host against its allowed origins).
        { socketPath: url.pathname, setHost: false, headers: { Host: "" } }
      : { host: url.hostname, port: url.port || 80 };
  const prefix = url.protocol === "unix:" ? "" : url.pathname.replace(/\/+$/, "");
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        ...target,
        method,
        path: `${prefix}${urlPath}`,
        agent: false,
        timeout: opts.timeoutMs,
        headers: { ...target.headers, ...(opts.body === undefined ? {} : { "content-type": "application/json" }) },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error(`no answer within ${opts.timeoutMs} ms`)));
    req.on("error", reject);
    req.end(opts.body);
  });
}

/** Whether a Caddy admin API answers at `adminUrl`. */
export async function probeCaddy(adminUrl: string, timeoutMs = 2000): Promise<boolean> {
  try {
    return (await caddyAdmin(adminUrl, "GET", "/config/", { timeoutMs })).status === 200;
  } catch {
    return false;
  }
}

export async function startCaddy(opts: StartCaddyOptions): Promise<StartedCaddy> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[caddy] ${line}\n`));
  const timeoutMs = opts.timeoutMs ?? 30_000;
  await ensureBinaries(["caddy"], log);
  const bin = caddyBin()!;
  if ((opts.adminPort === undefined) === (opts.adminSocket === undefined)) throw new Error("startCaddy needs exactly one of adminPort and adminSocket");
  for (const [port, what] of [
    [opts.adminPort, "Caddy's admin API (AGENT_ROUTER_ADMIN_URL)"],
    [opts.httpPort, "the router (PLATFORM_ROUTER_PORT)"],
  ] as const) {
    if (port !== undefined && !(await isPortFree(port))) throw new InfrastructureError(`port ${port}, meant for ${what}, is already in use`);
  }

  allowListenerMigration(log);
  const dataDir = path.resolve(opts.dataDir);
  fs.mkdirSync(dataDir, { recursive: true });
  const configFile = path.join(dataDir, "caddy.json");
  const logFile = path.join(dataDir, "caddy.log");
  const socket = opts.adminSocket === undefined ? undefined : path.resolve(opts.adminSocket);
  if (socket) {
    fs.mkdirSync(path.dirname(socket), { recursive: true, mode: 0o700 });
    // One a Caddy killed earlier left behind would make this one fail to listen.
    fs.rmSync(socket, { force: true });
  }
  const adminUrl = socket ? adminSocketUrl(socket) : `http://127.0.0.1:${opts.adminPort}`;
  const config = {
    // The agent re-asserts its routes when Caddy comes back empty; a saved copy would only go stale.
    admin: { listen: socket ? `unix/${socket}` : `127.0.0.1:${opts.adminPort}`, config: { persist: false } },
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
