/**
 * The two moving parts every process needs: Postgres and NATS with JetStream; and, for the dev
 * runner, the Caddy the agent routes apps through. When the machine already runs them
 * (DATABASE_URL, NATS_URL and the router's admin URL answer), they are used as they are. Otherwise
 * the dev runner starts its own from the installed server programs, with their data under
 * `.data/`, installing Debian's packages first when it can (root with apt-get) and saying exactly
 * what to install when it cannot. Whatever it started, it can stop; what the machine provided it
 * leaves alone.
 */
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import pg from "pg";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { isExecutable, isRoot, lastLines, run, runChecked, shellQuote, sleep, which } from "./exec.ts";
import { redactUrl } from "./paths.ts";
import { allowListenerMigration, caddyBin, probeCaddy, startCaddy } from "./caddy.ts";

export type InfraLog = (line: string) => void;
export type InfraPart = "postgres" | "nats" | "caddy";

export interface InfrastructureOptions {
  databaseUrl: string;
  natsUrl: string;
  /** Also a Caddy answering at `adminUrl` (the agent's AGENT_ROUTER_ADMIN_URL), serving apps on `port`. */
  router?: { adminUrl: string; port: number };
  /** Local data goes to `<dataDir>/postgres`, `<dataDir>/nats` and `<dataDir>/caddy`. */
  dataDir: string;
  log?: InfraLog;
  /** How long to wait for a server started here to answer (default 60 s). */
  timeoutMs?: number;
  /**
   * Start again a server started here when it dies, as compose's `restart: unless-stopped` does
   * (npm start): a dead Caddy would leave every deployed app unreachable until the next start.
   */
  keepRunning?: boolean;
}

export interface StartedInfrastructure {
  /** What this call started; empty when the machine provided both. */
  started: InfraPart[];
  /** Stops what this call started (nothing else). Safe to call twice. */
  stop(): Promise<void>;
}

/** A problem the user must fix on the machine; its message says how. */
export class InfrastructureError extends Error {
  override name = "InfrastructureError";
}

interface Probe {
  ok: boolean;
  reason?: string;
  /** Something answers but will never work as configured (auth, no JetStream): do not start another. */
  fatal?: boolean;
}

function errorText(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    return code && !err.message.includes(String(code)) ? `${err.message} (${String(code)})` : err.message || String(code ?? err);
  }
  return String(err);
}

/** Connects to the server's `postgres` database and runs `select 1`. */
export async function probePostgres(databaseUrl: string, timeoutMs = 2000): Promise<Probe> {
  const url = new URL(databaseUrl);
  url.pathname = "/postgres";
  const client = new pg.Client({ connectionString: url.toString(), connectionTimeoutMillis: timeoutMs });
  client.on("error", () => undefined);
  try {
    await client.connect();
    await client.query("select 1");
    return { ok: true };
  } catch (err) {
    const code = String((err as { code?: unknown }).code ?? "");
    const reason = errorText(err);
    // Class 28 is invalid authorization, 3D000 a missing database: a server that answers but refuses.
    const fatal = code.startsWith("28") || code === "3D000" || /password|SASL|SCRAM|authentication|no pg_hba/i.test(reason);
    return { ok: false, reason, fatal };
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Connects to NATS and asks JetStream for the account's info. */
export async function probeNats(natsUrl: string, timeoutMs = 2000): Promise<Probe> {
  let nc;
  try {
    nc = await connect({ servers: natsUrl, timeout: timeoutMs, reconnect: false, name: "platform-probe" });
  } catch (err) {
    return { ok: false, reason: errorText(err) };
  }
  try {
    const jsm = await jetstreamManager(nc, { timeout: timeoutMs });
    await jsm.getAccountInfo();
    return { ok: true };
  } catch (err) {
    return { ok: false, fatal: true, reason: `JetStream is not available (${errorText(err)})` };
  } finally {
    await nc.close().catch(() => undefined);
  }
}

function isLoopback(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\./.test(host);
}

function hostOf(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, "") || "127.0.0.1";
}

// ---------------------------------------------------------------------------------------------
// Installing the server programs

const APT_PACKAGE: Record<InfraPart, string> = { postgres: "postgresql", nats: "nats-server", caddy: "caddy" };
const BREW_PACKAGE: Record<InfraPart, string> = { postgres: "postgresql", nats: "nats-server", caddy: "caddy" };
const SYSTEMD_UNIT: Record<InfraPart, string> = { postgres: "postgresql", nats: "nats-server", caddy: "caddy" };
const PROGRAMS: Record<InfraPart, string> = {
  postgres: "PostgreSQL server programs (initdb, pg_ctl)",
  nats: "nats-server",
  caddy: "caddy",
};

function installHint(parts: InfraPart[]): string {
  const pkgs = parts.map((p) => APT_PACKAGE[p]).join(" ");
  if (which("apt-get")) return `sudo apt-get update && sudo apt-get install -y ${pkgs}`;
  const names = parts.map((p) => PROGRAMS[p]).join(" and ");
  return `install ${names} with your package manager (Debian/Ubuntu: apt-get install -y ${pkgs}; macOS: brew install ${parts
    .map((p) => BREW_PACKAGE[p])
    .join(" ")})`;
}

let aptUpdated = false;
let aptQueue: Promise<unknown> = Promise.resolve();

/** `apt-get update` (once per process) and `apt-get install -y`, one at a time. */
export function aptInstall(packages: string[], log: InfraLog): Promise<void> {
  const next = aptQueue.then(async () => {
    const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
    if (!aptUpdated) {
      log("apt-get update");
      await runChecked("apt-get", ["update"], { env });
      aptUpdated = true;
    }
    log(`apt-get install -y ${packages.join(" ")}`);
    await runChecked("apt-get", ["install", "-y", "--no-install-recommends", ...packages], { env });
  });
  aptQueue = next.catch(() => undefined);
  return next;
}

function postgresBinDir(): string | undefined {
  const base = "/usr/lib/postgresql";
  let versions: string[] = [];
  try {
    versions = fs.readdirSync(base).filter((v) => /^\d+(\.\d+)?$/.test(v));
  } catch {
    // not Debian's layout
  }
  versions.sort((a, b) => Number(b) - Number(a));
  for (const v of versions) {
    const dir = path.join(base, v, "bin");
    if (isExecutable(path.join(dir, "initdb")) && isExecutable(path.join(dir, "pg_ctl"))) return dir;
  }
  const pgCtl = which("pg_ctl");
  if (pgCtl) {
    const dir = path.dirname(fs.realpathSync(pgCtl));
    if (isExecutable(path.join(dir, "initdb"))) return dir;
  }
  return undefined;
}

export function natsServerBin(): string | undefined {
  return which("nats-server", ["/usr/sbin", "/usr/local/bin", "/usr/bin", "/usr/local/sbin"]);
}

function binaryPresent(part: InfraPart): boolean {
  if (part === "postgres") return postgresBinDir() !== undefined;
  return (part === "nats" ? natsServerBin() : caddyBin()) !== undefined;
}

/**
 * Makes sure the server programs of `parts` are installed. Installs Debian's packages when we are
 * root on a machine with apt-get; otherwise fails with the command to run.
 */
export async function ensureBinaries(parts: InfraPart[], log: InfraLog): Promise<InfraPart[]> {
  const missing = parts.filter((p) => !binaryPresent(p));
  if (missing.length === 0) return [];
  if (!(isRoot() && which("apt-get"))) {
    const what = missing.map((p) => PROGRAMS[p]).join(" and ");
    throw new InfrastructureError(`${what} not installed, and not running at the configured URL. Install with:\n  ${installHint(missing)}`);
  }
  await aptInstall(
    missing.map((p) => APT_PACKAGE[p]),
    log,
  );
  const still = missing.filter((p) => !binaryPresent(p));
  if (still.length > 0) {
    throw new InfrastructureError(`installed ${still.map((p) => APT_PACKAGE[p]).join(" ")} but its server program is still missing`);
  }
  // A systemd machine starts Debian's own services on install: Debian's nats-server without
  // JetStream, Debian's Postgres cluster with password auth, Debian's Caddy serving its own
  // Caddyfile on port 80 with its admin API where the agent's default points. Our runner manages
  // its own copies.
  if (which("systemctl")) {
    for (const p of missing) {
      const unit = SYSTEMD_UNIT[p];
      const active = await run("systemctl", ["is-active", "--quiet", unit]).catch(() => ({ code: 1 }));
      if (active.code === 0) {
        log(`stopping Debian's ${unit} service (installed just now; the dev runner runs its own)`);
        await run("systemctl", ["disable", "--now", unit]).catch(() => undefined);
      }
    }
  }
  return missing;
}

// ---------------------------------------------------------------------------------------------
// Postgres

interface Started {
  part: InfraPart;
  stop(): Promise<void>;
  /** Where its log goes, for the timeout message. */
  logFile: string;
  /** Set when the server process is known to have died. */
  died?: () => string | undefined;
}

async function idOf(user: string, flag: "-u" | "-g"): Promise<number | undefined> {
  const r = await run("id", [flag, user]).catch(() => undefined);
  if (!r || r.code !== 0) return undefined;
  const n = Number(r.output.trim());
  return Number.isInteger(n) ? n : undefined;
}

/** Runs a Postgres program as the `postgres` OS user when we are root (postgres refuses root). */
function postgresCommand(asPostgresUser: boolean, bin: string, args: string[]): [string, string[]] {
  if (!asPostgresUser) return [bin, args];
  const runuser = which("runuser", ["/usr/sbin", "/sbin"]);
  if (runuser) return [runuser, ["-u", "postgres", "--", bin, ...args]];
  return ["su", ["-s", "/bin/sh", "postgres", "-c", [bin, ...args].map(shellQuote).join(" ")]];
}

async function startPostgres(databaseUrl: string, dataDir: string, log: InfraLog): Promise<Started> {
  const binDir = postgresBinDir();
  if (!binDir) throw new InfrastructureError(`PostgreSQL server programs not found. Install with:\n  ${installHint(["postgres"])}`);
  const url = new URL(databaseUrl);
  const port = url.port || "5432";
  const host = hostOf(url);
  const user = decodeURIComponent(url.username || "postgres");
  const pgdata = path.join(dataDir, "postgres");
  const runDir = path.join(dataDir, "postgres-run");
  const logFile = path.join(runDir, "postgres.log");
  fs.mkdirSync(pgdata, { recursive: true, mode: 0o700 });
  fs.mkdirSync(runDir, { recursive: true, mode: 0o700 });

  const asPostgresUser = isRoot();
  if (asPostgresUser) {
    const uid = await idOf("postgres", "-u");
    const gid = await idOf("postgres", "-g");
    if (uid === undefined || gid === undefined) {
      throw new InfrastructureError(
        "Postgres refuses to run as root and there is no `postgres` OS user to run it as. Create one (useradd --system postgres) or install Debian's postgresql package.",
      );
    }
    for (const dir of [pgdata, runDir]) {
      fs.chownSync(dir, uid, gid);
      for (const entry of fs.readdirSync(dir, { recursive: true }) as string[]) {
        fs.lchownSync(path.join(dir, entry), uid, gid);
      }
    }
    const [cmd, args] = postgresCommand(true, "/bin/sh", ["-c", `test -w ${shellQuote(runDir)}`]);
    const reach = await run(cmd, args, { cwd: "/" });
    if (reach.code !== 0) {
      throw new InfrastructureError(
        `the postgres OS user cannot reach ${runDir}: make its parent directories searchable (chmod o+x) or point DATABASE_URL at a running Postgres`,
      );
    }
  }
  const pgRun = (bin: string, args: string[]) => {
    const [cmd, argv] = postgresCommand(asPostgresUser, path.join(binDir, bin), args);
    // cwd: a directory the postgres user can enter; detached: the terminal's Ctrl-C reaches our
    // runner (which stops things in order), never the database directly.
    return runChecked(cmd, argv, { cwd: runDir, detached: true });
  };

  if (!fs.existsSync(path.join(pgdata, "PG_VERSION"))) {
    log(`initdb ${pgdata}`);
    await pgRun("initdb", ["-D", pgdata, "-U", user, "--auth=trust", "--encoding=UTF8", "--locale=C"]);
  }
  log(`starting postgres on ${host}:${port} (data ${pgdata}, log ${logFile})`);
  const serverOpts = `-p ${port} -k ${shellQuote(runDir)} -c listen_addresses=${shellQuote(host)}`;
  try {
    await pgRun("pg_ctl", ["-D", pgdata, "-l", logFile, "-o", serverOpts, "-w", "-t", "60", "start"]);
  } catch (err) {
    const tail = fs.existsSync(logFile) ? lastLines(fs.readFileSync(logFile, "utf8"), 20) : "";
    throw new InfrastructureError(`could not start postgres: ${errorText(err)}${tail ? `\n--- ${logFile} ---\n${tail}` : ""}`);
  }
  let stopped: Promise<void> | undefined;
  return {
    part: "postgres",
    logFile,
    // pg_ctl daemonises the server: its pid is the first line of postmaster.pid.
    died: () => {
      let pid = Number.NaN;
      try {
        pid = Number(fs.readFileSync(path.join(pgdata, "postmaster.pid"), "utf8").split("\n", 1)[0]);
      } catch {
        // No postmaster.pid: the server is not running.
      }
      return Number.isInteger(pid) && pid > 0 && alive(pid) ? undefined : "postgres is no longer running";
    },
    stop() {
      stopped ??= pgRun("pg_ctl", ["-D", pgdata, "-m", "fast", "-w", "-t", "30", "stop"]).then(
        () => undefined,
        (err: unknown) => log(`stopping postgres failed: ${errorText(err)}`),
      );
      return stopped;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// NATS

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as { code?: string }).code === "EPERM";
  }
}

export async function stopPid(pid: number, graceMs = 10_000): Promise<void> {
  if (!alive(pid)) return;
  try {
    process.kill(pid, "SIGTERM");
  } catch {
    return;
  }
  const deadline = Date.now() + graceMs;
  while (alive(pid) && Date.now() < deadline) await sleep(100);
  if (alive(pid)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone in between
    }
  }
}

async function startNats(natsUrl: string, dataDir: string, log: InfraLog): Promise<Started> {
  const bin = natsServerBin();
  if (!bin) throw new InfrastructureError(`nats-server not found. Install with:\n  ${installHint(["nats"])}`);
  const url = new URL(natsUrl);
  const port = url.port || "4222";
  const host = hostOf(url);
  const storeDir = path.join(dataDir, "nats");
  const pidFile = path.join(dataDir, "nats.pid");
  const logFile = path.join(dataDir, "nats.log");
  fs.mkdirSync(storeDir, { recursive: true });
  log(`starting nats-server -js on ${host}:${port} (data ${storeDir}, log ${logFile})`);
  const child = spawn(bin, ["-js", "-sd", storeDir, "-a", host, "-p", port, "-P", pidFile, "-l", logFile], {
    detached: true,
    stdio: "ignore",
  });
  let exit: string | undefined;
  let spawnError: string | undefined;
  child.once("error", (err) => (spawnError = errorText(err)));
  child.once("exit", (code, signal) => (exit = signal ? `killed by ${signal}` : `exited with code ${code}`));
  child.unref();
  const pid = child.pid;
  let stopped: Promise<void> | undefined;
  return {
    part: "nats",
    logFile,
    died: () => spawnError ?? (exit ? `nats-server ${exit}` : undefined),
    stop() {
      stopped ??= (async () => {
        if (pid !== undefined && exit === undefined) await stopPid(pid);
        fs.rmSync(pidFile, { force: true });
      })();
      return stopped;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Caddy

async function startRouterCaddy(router: { adminUrl: string; port: number }, dataDir: string, log: InfraLog, timeoutMs: number): Promise<Started> {
  const admin = new URL(router.adminUrl);
  const caddy = await startCaddy({
    ...(admin.protocol === "unix:" ? { adminSocket: admin.pathname } : { adminPort: Number(admin.port || 80) }),
    httpPort: router.port,
    dataDir: path.join(dataDir, "caddy"),
    log,
    timeoutMs,
  });
  return { part: "caddy", logFile: caddy.logFile, died: () => (caddy.died() ? `caddy ${caddy.died()}` : undefined), stop: caddy.stop };
}

// ---------------------------------------------------------------------------------------------

async function waitUntilAnswers(
  label: string,
  url: string,
  probe: () => Promise<Probe>,
  started: Started,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: Probe = { ok: false };
  for (;;) {
    last = await probe();
    if (last.ok) return;
    const died = started.died?.();
    if (died || Date.now() >= deadline) {
      const tail = fs.existsSync(started.logFile) ? lastLines(fs.readFileSync(started.logFile, "utf8"), 20) : "";
      const why = died ?? `did not answer within ${Math.round(timeoutMs / 1000)} s`;
      throw new InfrastructureError(
        `${label} at ${redactUrl(url)} ${why} (last error: ${last.reason ?? "none"})${tail ? `\n--- ${started.logFile} ---\n${tail}` : ""}`,
      );
    }
    await sleep(250);
  }
}

function refusalMessage(part: InfraPart, url: string, reason: string | undefined): string {
  if (part === "postgres") {
    return (
      `Postgres at ${redactUrl(url)} answers but refuses the connection: ${reason}. ` +
      "Put working credentials in DATABASE_URL, or allow trust auth for local connections. " +
      "If it is Debian's packaged cluster, you can instead stop it (pg_ctlcluster <version> main stop) so that the dev runner starts its own under .data/."
    );
  }
  return (
    `NATS at ${redactUrl(url)} answers but ${reason}. Start it with JetStream enabled (nats-server -js), ` +
    "add a `jetstream {}` block to its config (Debian: /etc/nats-server.conf) and restart it, or stop it so that the dev runner starts its own."
  );
}

/**
 * Makes sure Postgres (DATABASE_URL), NATS with JetStream (NATS_URL) and, when `router` is given,
 * a Caddy admin API answer, starting local ones under `dataDir` when they do not. Returns what it
 * started so the caller can stop it.
 */
export async function ensureInfrastructure(opts: InfrastructureOptions): Promise<StartedInfrastructure> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[infra] ${line}\n`));
  const timeoutMs = opts.timeoutMs ?? 60_000;
  const urls: Record<InfraPart, string> = { postgres: opts.databaseUrl, nats: opts.natsUrl, caddy: opts.router?.adminUrl ?? "" };
  const probes: Record<InfraPart, () => Promise<Probe>> = {
    postgres: () => probePostgres(opts.databaseUrl),
    nats: () => probeNats(opts.natsUrl),
    caddy: async () => ((await probeCaddy(urls.caddy)) ? { ok: true } : { ok: false, reason: "no Caddy admin API answers" }),
  };
  const labels: Record<InfraPart, string> = { postgres: "Postgres", nats: "NATS", caddy: "Caddy" };
  const parts: InfraPart[] = opts.router ? ["postgres", "nats", "caddy"] : ["postgres", "nats"];

  const check = async () => {
    const results = await Promise.all(parts.map((p) => probes[p]()));
    const down: InfraPart[] = [];
    parts.forEach((p, i) => {
      const r = results[i]!;
      if (r.ok) return;
      if (r.fatal) throw new InfrastructureError(refusalMessage(p, urls[p], r.reason));
      down.push(p);
    });
    return { down, results };
  };

  // A Caddy already running (a service of the host) needs it as much as one started here.
  if (opts.router) allowListenerMigration(log);
  let { down, results } = await check();
  if (down.length === 0) return { started: [], stop: async () => undefined };

  for (const p of down) {
    const url = new URL(urls[p]);
    // A unix socket is on this machine by definition.
    if (url.protocol !== "unix:" && !isLoopback(url.hostname)) {
      const reason = results[parts.indexOf(p)]?.reason ?? "no answer";
      throw new InfrastructureError(
        `${labels[p]} at ${redactUrl(urls[p])} does not answer (${reason}); it is not on this machine, so it cannot be started here.`,
      );
    }
  }

  const installed = await ensureBinaries(down, log);
  if (installed.length > 0) ({ down } = await check());
  if (down.length === 0) return { started: [], stop: async () => undefined };

  fs.mkdirSync(opts.dataDir, { recursive: true });
  const started: Started[] = [];
  const stopAll = async () => {
    await Promise.all(started.map((s) => s.stop()));
  };
  const launch = async (p: InfraPart): Promise<Started> => {
    const s =
      p === "postgres"
        ? await startPostgres(urls[p], opts.dataDir, log)
        : p === "nats"
          ? await startNats(urls[p], opts.dataDir, log)
          : await startRouterCaddy(opts.router!, opts.dataDir, log, timeoutMs);
    started.push(s);
    await waitUntilAnswers(labels[p], urls[p], probes[p], s, timeoutMs);
    return s;
  };
  try {
    const settled = await Promise.allSettled(down.map(launch));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed) throw failed.reason;
  } catch (err) {
    await stopAll();
    throw err;
  }
  log(`${started.map((s) => s.part).join(", ")} ready`);
  const keeper = opts.keepRunning ? keepRunning(started, launch, log) : undefined;
  let stopping: Promise<void> | undefined;
  return {
    started: started.map((s) => s.part),
    stop() {
      stopping ??= (async () => {
        await keeper?.stop();
        await stopAll();
      })();
      return stopping;
    },
  };
}

const KEEP_CHECK_MS = 2000;
const KEEP_RETRY_MAX_MS = 60_000;

/**
 * Watches what ensureInfrastructure started and starts again whatever dies, trying again with a
 * doubling pause (up to a minute) while it will not start.
 */
function keepRunning(started: Started[], launch: (p: InfraPart) => Promise<Started>, log: InfraLog): { stop(): Promise<void> } {
  const parts = started.map((s) => s.part);
  const retry = new Map<InfraPart, { at: number; pauseMs: number }>();
  let stopping = false;
  let checking: Promise<void> | undefined;
  const check = async () => {
    for (const part of parts) {
      const current = started.find((s) => s.part === part);
      const why = current ? current.died?.() : `${part} is not running`;
      const wait = retry.get(part);
      if (stopping || !why || (wait && Date.now() < wait.at)) continue;
      if (current) {
        log(`${why}; starting ${part} again`);
        await current.stop();
        started.splice(started.indexOf(current), 1);
      }
      try {
        await launch(part);
        retry.delete(part);
        log(`${part} ready again`);
      } catch (err) {
        const pauseMs = Math.min((wait?.pauseMs ?? KEEP_CHECK_MS / 2) * 2, KEEP_RETRY_MAX_MS);
        retry.set(part, { at: Date.now() + pauseMs, pauseMs });
        log(`${part} did not start again (${errorText(err).split("\n", 1)[0]}); next try in ${pauseMs / 1000} s`);
        // launch keeps what it spawned before the failure; it is stopped before the next try.
        const failed = started.find((s) => s.part === part);
        if (failed) {
          await failed.stop();
          started.splice(started.indexOf(failed), 1);
        }
      }
    }
  };
  const timer = setInterval(() => {
    checking ??= check().finally(() => (checking = undefined));
  }, KEEP_CHECK_MS);
  timer.unref();
  return {
    async stop() {
      stopping = true;
      clearInterval(timer);
      await checking;
    },
  };
}
