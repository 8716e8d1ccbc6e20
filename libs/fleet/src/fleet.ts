/**
 * The fleet as real processes: the eight services, the gateway (one or more replicas) and one
 * agent, each a Node child process on its own port, wired together through the `<SERVICE>_URL`
 * variables. `npm start` shows their output prefixed with `[name]`; tests collect it per process.
 * A fleet is ready when every process answers its readiness endpoint.
 */
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { AGENT_HEALTH_PORT, GATEWAY_PORT, SERVICE_PORTS, SERVICES, serviceUrlVar, type ServiceName } from "@platform/config";
import { COMPILE_CACHE_DIR, REPO_ROOT } from "./paths.ts";
import { isPortFree } from "./ports.ts";
import { sleep } from "./exec.ts";

export type ProcessKind = "service" | "gateway" | "agent";
export type FleetOutput = "prefix" | "collect";

export interface FleetPorts {
  services: Record<ServiceName, number>;
  /** One entry per gateway replica. */
  gateways: number[];
  /** The agent's health port. */
  agent: number;
}

/** The fixed ports of libs/config (the ones compose and Kubernetes use too). */
export function defaultPorts(gatewayPort: number = GATEWAY_PORT): FleetPorts {
  return { services: { ...SERVICE_PORTS }, gateways: [gatewayPort], agent: AGENT_HEALTH_PORT };
}

/** Hands out a list of (free) ports: services first, then gateways, then the agent. */
export function portsFromList(list: number[], gatewayReplicas = 1): FleetPorts {
  const needed = SERVICES.length + gatewayReplicas + 1;
  if (list.length < needed) throw new Error(`a fleet with ${gatewayReplicas} gateway(s) needs ${needed} ports, got ${list.length}`);
  const services = Object.fromEntries(SERVICES.map((name, i) => [name, list[i]!])) as Record<ServiceName, number>;
  const gateways = list.slice(SERVICES.length, SERVICES.length + gatewayReplicas);
  return { services, gateways, agent: list[SERVICES.length + gatewayReplicas]! };
}

/** `IDENTITY_URL=http://127.0.0.1:7001`, ... for every service. */
export function serviceUrls(ports: FleetPorts, host = "127.0.0.1"): Record<string, string> {
  return Object.fromEntries(SERVICES.map((name) => [serviceUrlVar(name), `http://${host}:${ports.services[name]}`]));
}

export interface FleetProcess {
  readonly name: string;
  readonly kind: ProcessKind;
  readonly port: number;
  /** `http://127.0.0.1:<port>` */
  readonly url: string;
  readonly readyUrl: string;
  readonly pid: number | undefined;
  running(): boolean;
  /** "exit code 1", "signal SIGKILL", or undefined while it runs. */
  exitDescription(): string | undefined;
  /** Collected output lines (the newest ones, up to a bound). */
  logs(): string[];
  /** Resolves when the process has exited. */
  readonly exited: Promise<void>;
}

export interface StartFleetOptions {
  /** Environment shared by every process (DATABASE_URL, NATS_URL, BUS_PREFIX, LOG_LEVEL, ...). */
  env: NodeJS.ProcessEnv;
  ports?: FleetPorts;
  /** The root key handed to identity only (defaults to env.PLATFORM_ROOT_KEY). */
  rootKey?: string;
  /** `prefix`: print each line as `[name] ...` (npm start). `collect`: keep lines per process (tests). */
  output?: FleetOutput;
  /** Shown before each process name in `prefix` output, e.g. a fleet's label. */
  logPrefix?: string;
  /** With `collect`, also append each process's output to `<logDir>/<name>.log`. */
  logDir?: string;
  /** Repository root holding services/, gateway/, agent/ (default: this checkout). */
  cwd?: string;
  /** How long one process may take to become ready (default 120 s). */
  readyTimeoutMs?: number;
  /** Start the agent too (default true). */
  agent?: boolean;
  /** Aborting stops what was started and makes startFleet reject. */
  signal?: AbortSignal;
  /**
   * Start again a process that exits on its own after the fleet was ready, as compose's
   * `restart: unless-stopped` does (npm start). Waits 1 s, doubling on each exit up to 30 s; a
   * process that ran a minute starts over at 1 s.
   */
  restartOnExit?: boolean;
}

export interface Fleet {
  /** `http://127.0.0.1:<port>` of the first gateway. */
  gatewayUrl: string;
  /** Every gateway replica's base URL. */
  gatewayUrls: string[];
  processes: FleetProcess[];
  process(name: string): FleetProcess | undefined;
  /** The collected output of one process, joined with newlines. */
  logs(name: string): string;
  /**
   * Ends one process with `signal` (default SIGKILL: a crash) and starts it again with the same
   * environment and port; resolves once it is ready. For recovery tests.
   */
  restart(name: string, signal?: NodeJS.Signals): Promise<FleetProcess>;
  /** SIGTERM to every process, SIGKILL to those still running after 10 s. */
  stop(): Promise<void>;
}

export class FleetStartError extends Error {
  override name = "FleetStartError";
  readonly processName: string | undefined;
  readonly logTail: string;
  constructor(message: string, processName?: string, logTail = "") {
    super(logTail ? `${message}\n--- last lines of ${processName} ---\n${logTail}` : message);
    this.processName = processName;
    this.logTail = logTail;
  }
}

const MAX_LINES = 20_000;
const FAILURE_TAIL = 40;
const STOP_GRACE_MS = 10_000;
const RESTART_FIRST_MS = 1000;
const RESTART_MAX_MS = 30_000;
const RESTART_RESET_MS = 60_000;

interface ProcessSpec {
  name: string;
  kind: ProcessKind;
  entry: string;
  port: number;
  readyPath: string;
  env: Record<string, string>;
}

// ---------------------------------------------------------------------------------------------
// Output

const NAME_COLORS = [36, 33, 32, 35, 34, 96, 93, 92, 95, 94, 91, 31];
const LEVEL_COLORS: Record<string, number> = { trace: 90, debug: 90, info: 32, warn: 33, error: 31, fatal: 41 };
const PINO_FIELDS = new Set(["level", "time", "msg", "pid", "hostname", "service.name", "err"]);

function paint(on: boolean, code: number, text: string): string {
  return on ? `\x1b[${code}m${text}\x1b[0m` : text;
}

/**
 * One pino JSON line as `12:00:01 INFO message key=value`; anything else unchanged. An `err`
 * field's stack follows on its own lines.
 */
export function formatLogLine(line: string, color = false): string[] {
  if (!line.startsWith("{")) return [line];
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return [line];
  }
  if (typeof rec !== "object" || rec === null || !("msg" in rec || "level" in rec)) return [line];
  const time = typeof rec.time === "string" ? rec.time.slice(11, 19) : typeof rec.time === "number" ? new Date(rec.time).toISOString().slice(11, 19) : "";
  const level = String(rec.level ?? "info");
  const extras = Object.entries(rec)
    .filter(([k]) => !PINO_FIELDS.has(k) && !k.startsWith("trace_") && k !== "span_id")
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`);
  const head = [time, paint(color, LEVEL_COLORS[level] ?? 0, level.toUpperCase().padEnd(5)), String(rec.msg ?? ""), ...extras]
    .filter((s) => s !== "")
    .join(" ");
  const out = [head];
  const err = rec.err as { stack?: unknown; message?: unknown } | undefined;
  if (err && typeof err === "object") {
    const text = typeof err.stack === "string" ? err.stack : typeof err.message === "string" ? err.message : JSON.stringify(err);
    out.push(...text.split("\n").map((l) => `  ${l}`));
  }
  return out;
}

function splitLines(stream: NodeJS.ReadableStream | null, onLine: (line: string) => void): void {
  if (!stream) return;
  let buffered = "";
  stream.setEncoding("utf8");
  stream.on("data", (chunk: string) => {
    buffered += chunk;
    let i: number;
    while ((i = buffered.indexOf("\n")) >= 0) {
      onLine(buffered.slice(0, i).replace(/\r$/, ""));
      buffered = buffered.slice(i + 1);
    }
  });
  stream.on("end", () => {
    if (buffered) onLine(buffered);
    buffered = "";
  });
}

// ---------------------------------------------------------------------------------------------
// One process

interface Managed extends FleetProcess {
  child: ChildProcess;
  /** Resolves once its output streams are drained too (bounded wait). */
  drained(): Promise<void>;
  closeLogFile(): void;
}

interface LaunchContext {
  cwd: string;
  output: FleetOutput;
  logDir?: string;
  labelWidth: number;
  color: boolean;
  colorCode: number;
  logPrefix?: string;
}

function launch(spec: ProcessSpec, ctx: LaunchContext): Managed {
  const lines: string[] = [];
  const file = ctx.output === "collect" && ctx.logDir ? fs.createWriteStream(path.join(ctx.logDir, `${spec.name}.log`), { flags: "a" }) : undefined;
  file?.on("error", () => undefined);
  const labelText = `[${ctx.logPrefix ? `${ctx.logPrefix}:` : ""}${spec.name}]`.padEnd(ctx.labelWidth + 2);
  const label = paint(ctx.color, ctx.colorCode, labelText);

  const record = (line: string) => {
    lines.push(line);
    if (lines.length > MAX_LINES) lines.splice(0, lines.length - MAX_LINES);
    file?.write(`${line}\n`);
    if (ctx.output === "prefix") {
      for (const shown of formatLogLine(line, ctx.color)) process.stdout.write(`${label} ${shown}\n`);
    }
  };

  const child = spawn(
    process.execPath,
    ["--disable-warning=ExperimentalWarning", "--import", "@platform/telemetry/register", spec.entry],
    // Compiled code is kept across starts (Node's compile cache): every process loads the same
    // few thousand modules, and a start from the cache compiles them again only when they change.
    { cwd: ctx.cwd, env: { NODE_COMPILE_CACHE: COMPILE_CACHE_DIR, ...spec.env }, stdio: ["ignore", "pipe", "pipe"] },
  );
  let exit: string | undefined;
  let resolveExited: () => void = () => undefined;
  const exited = new Promise<void>((resolve) => (resolveExited = resolve));
  let resolveClosed: () => void = () => undefined;
  const closed = new Promise<void>((resolve) => (resolveClosed = resolve));
  child.once("error", (err) => {
    record(`could not start: ${err.message}`);
    exit ??= "spawn error";
    resolveExited();
    resolveClosed();
  });
  child.once("exit", (code, signal) => {
    exit ??= signal ? `signal ${signal}` : `exit code ${code}`;
    resolveExited();
  });
  child.once("close", () => resolveClosed());
  splitLines(child.stdout, record);
  splitLines(child.stderr, record);

  return {
    name: spec.name,
    kind: spec.kind,
    port: spec.port,
    url: `http://127.0.0.1:${spec.port}`,
    readyUrl: `http://127.0.0.1:${spec.port}${spec.readyPath}`,
    pid: child.pid,
    child,
    exited,
    running: () => exit === undefined,
    exitDescription: () => exit,
    logs: () => [...lines],
    // A grandchild holding the pipes open must not hold up a stop: wait for the streams a moment only.
    drained: () => exited.then(() => Promise.race([closed, sleep(1000)])),
    closeLogFile: () => file?.end(),
  };
}

function tail(p: FleetProcess): string {
  return p.logs().slice(-FAILURE_TAIL).join("\n");
}

async function terminate(p: Managed): Promise<void> {
  if (p.running()) {
    p.child.kill("SIGTERM");
    const killed = await Promise.race([p.exited.then(() => false), sleep(STOP_GRACE_MS).then(() => true)]);
    if (killed && p.running()) p.child.kill("SIGKILL");
  }
  await p.drained();
  p.closeLogFile();
}

/**
 * One GET on a connection of its own that is closed afterwards: a kept-alive probe connection
 * would hold up the server's graceful close later.
 */
function probe(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false, timeout: 2000, headers: { connection: "close" } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error("no answer within 2 s")));
    req.on("error", reject);
  });
}

async function waitReady(p: Managed, timeoutMs: number, signal: AbortSignal | undefined): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "no answer yet";
  for (;;) {
    if (!p.running()) {
      await p.drained();
      throw new FleetStartError(`${p.name} exited (${p.exitDescription()}) before it was ready`, p.name, tail(p));
    }
    if (signal?.aborted) throw new FleetStartError("fleet start aborted");
    try {
      const res = await probe(p.readyUrl);
      if (res.status === 200) return;
      last = `HTTP ${res.status} ${res.body.slice(0, 300)}`;
    } catch (err) {
      last = (err as { code?: string }).code ?? (err instanceof Error ? err.message : String(err));
    }
    if (Date.now() >= deadline) {
      throw new FleetStartError(
        `${p.name} was not ready at ${p.readyUrl} within ${Math.round(timeoutMs / 1000)} s (last answer: ${last})`,
        p.name,
        tail(p),
      );
    }
    await Promise.race([sleep(250), p.exited]);
  }
}

// ---------------------------------------------------------------------------------------------
// The fleet

function cleanEnv(env: Record<string, string | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return out;
}

function processSpecs(opts: StartFleetOptions, ports: FleetPorts): ProcessSpec[] {
  const rootKey = opts.rootKey ?? opts.env.PLATFORM_ROOT_KEY;
  const shared: Record<string, string | undefined> = { ...opts.env, ...serviceUrls(ports) };
  // Only identity reads the root key; nobody else gets to see it.
  delete shared.PLATFORM_ROOT_KEY;
  // Without a collector there is nothing to export to. The OpenTelemetry SDK would otherwise
  // set up its default OTLP metrics exporter (localhost:4318) from the environment, and every
  // process would spend ~8 s at shutdown failing to flush it.
  if (!shared.OTEL_EXPORTER_OTLP_ENDPOINT) {
    shared.OTEL_METRICS_EXPORTER ??= "none";
    shared.OTEL_LOGS_EXPORTER ??= "none";
  }
  const specs: ProcessSpec[] = SERVICES.map((name) => ({
    name,
    kind: "service",
    entry: `services/${name}/src/main.ts`,
    port: ports.services[name],
    readyPath: "/readyz",
    env: cleanEnv({
      ...shared,
      OTEL_SERVICE_NAME: name,
      RPC_PORT: String(ports.services[name]),
      RPC_HOST: "127.0.0.1",
      ...(name === "identity" && rootKey ? { PLATFORM_ROOT_KEY: rootKey } : {}),
    }),
  }));
  ports.gateways.forEach((port, i) => {
    specs.push({
      name: i === 0 ? "gateway" : `gateway-${i + 1}`,
      kind: "gateway",
      entry: "gateway/src/main.ts",
      port,
      readyPath: "/api/health",
      env: cleanEnv({ ...shared, OTEL_SERVICE_NAME: "gateway", PORT: String(port), HOST: opts.env.HOST || "127.0.0.1" }),
    });
  });
  if (opts.agent ?? true) {
    specs.push({
      name: "agent",
      kind: "agent",
      entry: "agent/src/main.ts",
      port: ports.agent,
      readyPath: "/readyz",
      env: cleanEnv({
        ...shared,
        OTEL_SERVICE_NAME: "agent",
        AGENT_HEALTH_PORT: String(ports.agent),
        AGENT_HEALTH_HOST: "127.0.0.1",
      }),
    });
  }
  return specs;
}

export async function startFleet(opts: StartFleetOptions): Promise<Fleet> {
  const cwd = opts.cwd ?? REPO_ROOT;
  const ports = opts.ports ?? defaultPorts();
  const output = opts.output ?? "prefix";
  const readyTimeoutMs = opts.readyTimeoutMs ?? 120_000;
  const specs = processSpecs(opts, ports);

  const missing = specs.filter((s) => !fs.existsSync(path.join(cwd, s.entry)));
  if (missing.length > 0) {
    throw new FleetStartError(`missing process entry points: ${[...new Set(missing.map((s) => s.entry))].join(", ")}`);
  }
  const busy: string[] = [];
  // Only the gateway's port is the user's to choose (PORT); the others are the fleet's fixed ones.
  for (const s of specs) if (!(await isPortFree(s.port))) busy.push(`${s.port} (${s.name}${s.kind === "gateway" ? ", set by PORT" : ""})`);
  if (busy.length > 0) {
    throw new FleetStartError(`port${busy.length > 1 ? "s" : ""} already in use: ${busy.join(", ")}. Is another fleet (npm start) running?`);
  }
  if (output === "collect" && opts.logDir) fs.mkdirSync(opts.logDir, { recursive: true });

  const color = output === "prefix" && Boolean(process.stdout.isTTY) && !process.env.NO_COLOR;
  const labelWidth = Math.max(...specs.map((s) => s.name.length)) + (opts.logPrefix ? opts.logPrefix.length + 1 : 0);
  const procs: Managed[] = [];
  let stopping = false;

  // If this process exits without stopping the fleet (a crashed test run), the children go too.
  const onParentExit = () => {
    for (const p of procs) if (p.running()) p.child.kill("SIGTERM");
  };
  process.on("exit", onParentExit);

  let stopped: Promise<void> | undefined;
  const stop = () => {
    stopping = true;
    stopped ??= Promise.all(procs.map(terminate)).then(() => {
      process.off("exit", onParentExit);
    });
    return stopped;
  };

  const start = (group: ProcessSpec[]) =>
    group.map((spec) => {
      const p = launch(spec, { cwd, output, logDir: opts.logDir, labelWidth, color, colorCode: NAME_COLORS[specs.indexOf(spec) % NAME_COLORS.length]!, logPrefix: opts.logPrefix });
      procs.push(p);
      return p;
    });

  const abort = new Promise<never>((_, reject) => {
    const onAbort = () => reject(new FleetStartError("fleet start aborted"));
    if (opts.signal?.aborted) onAbort();
    opts.signal?.addEventListener("abort", onAbort, { once: true });
  });
  abort.catch(() => undefined);

  try {
    // Services first (each migrates its own schema), then what depends on them.
    for (const group of [specs.filter((s) => s.kind === "service"), specs.filter((s) => s.kind !== "service")]) {
      const launched = start(group);
      await Promise.race([Promise.all(launched.map((p) => waitReady(p, readyTimeoutMs, opts.signal))), abort]);
    }
  } catch (err) {
    await stop();
    throw err;
  }

  const replaced = new Set<Managed>();
  const restartDelayMs = new Map<string, number>();
  const watch = (p: Managed) => {
    const startedAt = Date.now();
    void p.exited.then(() => {
      if (stopping || replaced.has(p)) return;
      const ranMs = Date.now() - startedAt;
      const previous = restartDelayMs.get(p.name);
      const delayMs = previous === undefined || ranMs >= RESTART_RESET_MS ? RESTART_FIRST_MS : Math.min(previous * 2, RESTART_MAX_MS);
      restartDelayMs.set(p.name, delayMs);
      const plan = opts.restartOnExit ? `; starting it again in ${delayMs / 1000} s` : "";
      if (output === "prefix") {
        process.stdout.write(`${paint(color, 31, `[${p.name}]`)} exited (${p.exitDescription()})${plan}\n`);
      }
      if (!opts.restartOnExit) return;
      void sleep(delayMs).then(async () => {
        if (stopping) return;
        // A start that fails ends in the new process's own exit, which this watch sees again.
        const again = await restart(p.name).catch(() => undefined);
        if (again && output === "prefix") process.stdout.write(`${paint(color, 32, `[${p.name}]`)} ready again\n`);
      });
    });
  };
  for (const p of procs) watch(p);

  const restart = async (name: string, signal: NodeJS.Signals = "SIGKILL"): Promise<FleetProcess> => {
    const i = procs.findIndex((p) => p.name === name);
    const spec = specs.find((s) => s.name === name);
    if (i === -1 || !spec) throw new Error(`no process named ${name} in this fleet`);
    const old = procs[i]!;
    replaced.add(old);
    if (old.running()) old.child.kill(signal);
    await old.exited;
    await old.drained();
    old.closeLogFile();
    const p = start([spec])[0]!;
    procs.splice(procs.indexOf(p), 1);
    procs[i] = p;
    watch(p);
    try {
      await waitReady(p, readyTimeoutMs, opts.signal);
    } catch (err) {
      // Not ready in time yet running: ended, so that it counts as an exit like any other.
      if (p.running()) p.child.kill("SIGKILL");
      throw err;
    }
    return p;
  };

  const gateways = procs.filter((p) => p.kind === "gateway");
  return {
    gatewayUrl: gateways[0]?.url ?? "",
    gatewayUrls: gateways.map((p) => p.url),
    processes: procs,
    process: (name) => procs.find((p) => p.name === name),
    logs: (name) => procs.find((p) => p.name === name)?.logs().join("\n") ?? "",
    restart,
    stop,
  };
}
