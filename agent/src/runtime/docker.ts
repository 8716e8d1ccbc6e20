/**
 * The `docker` runtime driver (ARCHITECTURE section 5): each replica is a container of one base
 * image with the release bind-mounted at /app, on the host's network so that it listens on
 * 127.0.0.1:<port> exactly like a `process` replica and the router needs no difference. The engine
 * is this driver's record: every container carries its spec in a label, so adopt() after an agent
 * restart rebuilds everything from `GET /containers/json`. Exits and OOM kills come from the
 * engine's event stream, output from each container's log stream. It talks to the Docker Engine
 * API over the unix socket with node:http, so the agent needs no Docker client library.
 */
import http from "node:http";
import type { Logger } from "@platform/logger";
import type { ExitInfo, OutputLine, ReplicaSpec, ReplicaState, RuntimeDriver } from "./types.ts";

/** The API version this driver is written against; older engines are spoken to in their own. */
export const API_VERSION = "1.43";
const DEFAULT_IMAGE = "node:24-slim";
const MiB = 1024 * 1024;
/** How long an ordinary request may stay silent before it counts as hung. */
const REQUEST_IDLE_MS = 30_000;
/** Pulls report progress as they go: this long with no progress line means the pull is stuck. */
const PULL_IDLE_MS = 120_000;
const RECONNECT_MIN_MS = 500;
const RECONNECT_MAX_MS = 30_000;
/** A replica that writes without newlines must not grow the agent's memory without bound. */
const MAX_LINE_BYTES = 64 * 1024;

export const LABELS = {
  replica: "platform.replica",
  app: "platform.app",
  branch: "platform.branch",
  group: "platform.group",
  service: "platform.service",
  colour: "platform.colour",
  spec: "platform.spec",
} as const;

export function containerName(replicaId: string): string {
  return `platform-${replicaId}`;
}

// ---------------------------------------------------------------------------------------------
// Requests

type QueryValue = string | number | boolean | object | undefined;

export interface EngineRequest {
  method: "GET" | "POST" | "DELETE";
  /** Path below the version prefix, e.g. `/containers/json`; path segments already encoded. */
  path: string;
  /** Objects (filters) are sent as JSON, as the engine expects; undefined values are left out. */
  query?: Record<string, QueryValue>;
  body?: unknown;
}

export interface BuiltRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: string | null;
}

/** The HTTP request for an engine call; `apiVersion` null for the unversioned `/_ping` and `/version`. */
export function buildRequest(apiVersion: string | null, req: EngineRequest): BuiltRequest {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(req.query ?? {})) {
    if (value === undefined) continue;
    params.set(key, typeof value === "object" ? JSON.stringify(value) : String(value));
  }
  const query = params.toString();
  const body = req.body === undefined ? null : JSON.stringify(req.body);
  // The engine ignores Host on its socket, but HTTP/1.1 requires one.
  const headers: Record<string, string> = { host: "docker" };
  if (body !== null) {
    headers["content-type"] = "application/json";
    headers["content-length"] = String(Buffer.byteLength(body));
  }
  return {
    method: req.method,
    path: `${apiVersion === null ? "" : `/v${apiVersion}`}${req.path}${query ? `?${query}` : ""}`,
    headers,
    body,
  };
}

/** The lower of the engine's API version and ours: newer engines still serve older versions. */
export function negotiateApiVersion(engineVersion: unknown): string {
  if (typeof engineVersion !== "string" || !/^\d+\.\d+$/.test(engineVersion)) return API_VERSION;
  const [engineMajor = 0, engineMinor = 0] = engineVersion.split(".").map(Number);
  const [ourMajor = 0, ourMinor = 0] = API_VERSION.split(".").map(Number);
  const older = engineMajor < ourMajor || (engineMajor === ourMajor && engineMinor < ourMinor);
  return older ? engineVersion : API_VERSION;
}

/** `fromImage` and `tag` for a pull: without a tag the engine would pull every tag of the repository. */
export function splitImageRef(ref: string): { fromImage: string; tag: string } {
  const at = ref.indexOf("@");
  if (at >= 0) return { fromImage: ref.slice(0, at), tag: ref.slice(at + 1) };
  const colon = ref.lastIndexOf(":");
  // A colon before the last slash belongs to a registry's port, not to a tag.
  if (colon > ref.lastIndexOf("/")) return { fromImage: ref.slice(0, colon), tag: ref.slice(colon + 1) };
  return { fromImage: ref, tag: "latest" };
}

export class DockerError extends Error {
  readonly status: number;

  constructor(status: number, message: string) {
    super(message);
    this.name = "DockerError";
    this.status = status;
  }
}

interface Reply {
  status: number;
  body: Buffer;
}

function engineMessage(body: Buffer): string {
  try {
    const parsed = JSON.parse(body.toString("utf8")) as { message?: unknown };
    if (typeof parsed.message === "string") return parsed.message;
  } catch {
    // Not every error body is JSON (a proxy in front of the socket, say): show it as text.
  }
  return body.toString("utf8").trim().slice(0, 500) || "no detail";
}

function send(socketPath: string, built: BuiltRequest, idleMs: number): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, method: built.method, path: built.path, headers: built.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.setTimeout(idleMs, () => req.destroy(new Error(`the Docker engine was silent for ${idleMs} ms on ${built.method} ${built.path}`)));
    req.on("error", reject);
    req.end(built.body ?? undefined);
  });
}

/**
 * A streaming call (events, followed logs). The request is returned at once so that it can be
 * aborted before the engine answers; `response` resolves once a 2xx status arrived.
 * `headerTimeoutMs` null: engines before 25.0.4 send a log stream's headers only with its first
 * line (moby#47448), so a quiet replica's stream may rightly wait for them indefinitely.
 */
function openStream(
  socketPath: string,
  built: BuiltRequest,
  headerTimeoutMs: number | null,
): { req: http.ClientRequest; response: Promise<http.IncomingMessage> } {
  const req = http.request({ socketPath, method: built.method, path: built.path, headers: built.headers });
  const response = new Promise<http.IncomingMessage>((resolve, reject) => {
    req.on("response", (res) => {
      // Once open, a stream may rightly stay silent for hours.
      req.setTimeout(0);
      const status = res.statusCode ?? 0;
      if (status >= 200 && status < 300) {
        resolve(res);
        return;
      }
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => reject(new DockerError(status, `${built.method} ${built.path}: ${engineMessage(Buffer.concat(chunks))}`)));
      res.on("error", reject);
    });
    req.on("error", reject);
  });
  if (headerTimeoutMs !== null) {
    req.setTimeout(headerTimeoutMs, () => req.destroy(new Error(`the Docker engine did not answer ${built.method} ${built.path}`)));
  }
  req.end(built.body ?? undefined);
  return { req, response };
}

/** True when a Docker engine answers `GET /_ping` on the socket. */
export async function engineAnswers(socketPath: string, timeoutMs = 2_000): Promise<boolean> {
  try {
    const reply = await send(socketPath, buildRequest(null, { method: "GET", path: "/_ping" }), timeoutMs);
    return reply.status === 200 && reply.body.toString("utf8") === "OK";
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Output: the multiplexed stream

export type FrameStream = "stdout" | "stderr" | "system";

export interface Frame {
  stream: FrameStream;
  payload: Buffer;
}

/**
 * Splits the engine's multiplexed stream (a container without a TTY): each frame is an 8-byte
 * header (stream type, three zero bytes, payload length as uint32 big-endian) and the payload.
 * Returns the complete frames and the bytes of an incomplete one, to be prefixed to the next chunk.
 */
export function readFrames(buffer: Buffer): { frames: Frame[]; rest: Buffer } {
  const frames: Frame[] = [];
  let offset = 0;
  while (buffer.length - offset >= 8) {
    const size = buffer.readUInt32BE(offset + 4);
    if (buffer.length - offset - 8 < size) break;
    const type = buffer[offset];
    // Type 0 (stdin) is documented as written on stdout; type 3 carries the engine's own errors.
    const stream: FrameStream = type === 2 ? "stderr" : type === 3 ? "system" : "stdout";
    frames.push({ stream, payload: buffer.subarray(offset + 8, offset + 8 + size) });
    offset += 8 + size;
  }
  return { frames, rest: buffer.subarray(offset) };
}

/**
 * Complete lines of `pending` + `data` (without their `\n` or `\r\n`) and the unterminated rest.
 * Lines are cut on bytes and decoded whole, so a character split across chunks stays intact.
 */
export function splitLines(pending: Buffer, data: Buffer, maxLineBytes = MAX_LINE_BYTES): { lines: string[]; rest: Buffer } {
  let buffer = pending.length === 0 ? data : Buffer.concat([pending, data]);
  const lines: string[] = [];
  for (;;) {
    const newline = buffer.indexOf(0x0a);
    if (newline < 0) break;
    lines.push(decodeLine(buffer.subarray(0, newline)));
    buffer = buffer.subarray(newline + 1);
  }
  while (buffer.length >= maxLineBytes) {
    lines.push(decodeLine(buffer.subarray(0, maxLineBytes)));
    buffer = buffer.subarray(maxLineBytes);
  }
  return { lines, rest: buffer };
}

function decodeLine(bytes: Buffer): string {
  const line = bytes.toString("utf8");
  return line.endsWith("\r") ? line.slice(0, -1) : line;
}

export interface DemuxedLine {
  stream: FrameStream;
  line: string;
}

/** Lines of a multiplexed log stream, in the order they complete; each stream keeps its own partial line. */
export class LogDemuxer {
  #frames: Buffer = Buffer.alloc(0);
  readonly #partial: Record<FrameStream, Buffer> = { stdout: Buffer.alloc(0), stderr: Buffer.alloc(0), system: Buffer.alloc(0) };

  push(chunk: Buffer): DemuxedLine[] {
    const { frames, rest } = readFrames(this.#frames.length === 0 ? chunk : Buffer.concat([this.#frames, chunk]));
    // Copied so that the small rest does not pin the whole chunk it was cut from.
    this.#frames = Buffer.from(rest);
    const out: DemuxedLine[] = [];
    for (const frame of frames) {
      const { lines, rest: partial } = splitLines(this.#partial[frame.stream], frame.payload);
      this.#partial[frame.stream] = Buffer.from(partial);
      for (const line of lines) out.push({ stream: frame.stream, line });
    }
    return out;
  }

  /** The unterminated last line of each stream, when the stream is over. */
  end(): DemuxedLine[] {
    const out: DemuxedLine[] = [];
    for (const stream of ["stdout", "stderr", "system"] as const) {
      if (this.#partial[stream].length > 0) out.push({ stream, line: decodeLine(this.#partial[stream]) });
      this.#partial[stream] = Buffer.alloc(0);
    }
    this.#frames = Buffer.alloc(0);
    return out;
  }
}

// ---------------------------------------------------------------------------------------------
// The container: labels and create body

export function specLabels(spec: ReplicaSpec): Record<string, string> {
  return {
    [LABELS.replica]: spec.id,
    [LABELS.app]: spec.app,
    [LABELS.branch]: spec.branch,
    [LABELS.group]: spec.group,
    [LABELS.service]: spec.service,
    [LABELS.colour]: spec.colour,
    [LABELS.spec]: JSON.stringify(spec),
  };
}

const STRING_FIELDS = ["id", "group", "app", "branch", "service", "tag", "releaseDir", "command"] as const;

/** The spec a container was started with, or null when its labels are not one this driver wrote. */
export function specFromLabels(labels: Record<string, string> | null | undefined): ReplicaSpec | null {
  const raw = labels?.[LABELS.spec];
  if (raw === undefined) return null;
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return null;
  }
  if (typeof value !== "object" || value === null) return null;
  const o = value as Record<string, unknown>;
  if (!STRING_FIELDS.every((key) => typeof o[key] === "string")) return null;
  if (o.colour !== "blue" && o.colour !== "green") return null;
  if (!Number.isInteger(o.index)) return null;
  if (o.port !== null && !Number.isInteger(o.port)) return null;
  if (o.memoryMb !== null && typeof o.memoryMb !== "number") return null;
  if (typeof o.env !== "object" || o.env === null || !Object.values(o.env).every((v) => typeof v === "string")) return null;
  // The filter label is what events and listings are matched by: a spec naming another replica is not trusted.
  if (o.id !== labels?.[LABELS.replica]) return null;
  return {
    id: o.id as string,
    group: o.group as string,
    app: o.app as string,
    branch: o.branch as string,
    service: o.service as string,
    colour: o.colour,
    index: o.index as number,
    tag: o.tag as string,
    ...(typeof o.deploymentId === "string" ? { deploymentId: o.deploymentId } : {}),
    releaseDir: o.releaseDir as string,
    command: o.command as string,
    env: { ...(o.env as Record<string, string>) },
    port: o.port as number | null,
    memoryMb: o.memoryMb as number | null,
  };
}

/** The body of `POST /containers/create` for a replica. */
export function containerConfig(spec: ReplicaSpec, image: string): Record<string, unknown> {
  const env: Record<string, string> = { ...spec.env };
  if (spec.port !== null) env.PORT = String(spec.port);
  const hostConfig: Record<string, unknown> = {
    // A mount, not `Binds`: the engine refuses a missing source instead of creating an empty one.
    Mounts: [{ Type: "bind", Source: spec.releaseDir, Target: "/app" }],
    // The replica listens on the host's loopback like a `process` replica, where the router looks.
    NetworkMode: "host",
    // The agent's supervisor decides about restarts; the engine restarting too would race it.
    RestartPolicy: { Name: "no" },
    // `sh` as PID 1 ignores SIGTERM, so every stop would wait out the grace period and SIGKILL.
    Init: true,
    // The log endpoints need a driver that can be read back, and a chatty replica must not fill the disk.
    LogConfig: { Type: "json-file", Config: { "max-size": "10m", "max-file": "3" } },
  };
  if (spec.memoryMb !== null) {
    const bytes = Math.round(spec.memoryMb * MiB);
    hostConfig.Memory = bytes;
    // Equal to Memory: no swap on top, so reaching the limit is an OOM kill, as with the process driver.
    hostConfig.MemorySwap = bytes;
  }
  return {
    Image: image,
    Cmd: ["sh", "-c", spec.command],
    Env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
    WorkingDir: "/app",
    Labels: specLabels(spec),
    Tty: false,
    OpenStdin: false,
    AttachStdin: false,
    AttachStdout: false,
    AttachStderr: false,
    HostConfig: hostConfig,
  };
}

interface ContainerInspect {
  Id: string;
  State: { Running: boolean; ExitCode: number; OOMKilled: boolean; StartedAt: string; FinishedAt: string };
}

interface ContainerSummary {
  Id: string;
  Labels?: Record<string, string> | null;
}

interface EngineEvent {
  Type?: string;
  Action?: string;
  Actor?: { ID?: string; Attributes?: Record<string, string> };
}

/** The engine's times, where the zero time (`0001-01-01...`) means "not yet". */
function engineDate(value: string | undefined): Date {
  const date = new Date(value ?? "");
  return Number.isNaN(date.getTime()) || date.getUTCFullYear() < 1970 ? new Date() : date;
}

function exitFromInspect(info: ContainerInspect, oomEventSeen: boolean): ExitInfo {
  // The engine reports an exit code only: a signal shows as 128+n, as a shell would report it.
  return { code: info.State.ExitCode, signal: null, oomKilled: info.State.OOMKilled || oomEventSeen, at: engineDate(info.State.FinishedAt) };
}

// ---------------------------------------------------------------------------------------------
// The driver

export interface DockerDriverOptions {
  socketPath: string;
  /**
   * Taken so that both drivers are built from the same options; the engine keeps this driver's
   * records (the containers and their labels), so nothing is written here.
   */
  runDir: string;
  /** The base image every replica runs in (default `node:24-slim`). */
  image?: string;
  logger?: Logger;
}

interface Replica {
  state: ReplicaState;
  /** stop() or remove() asked for this exit: it is recorded, not reported. */
  stopRequested: boolean;
  /** The exit being recorded; events, stop() and a closed log stream may all notice the same one. */
  exiting: Promise<void> | null;
  /** The followed log stream, null when not following. */
  logs: http.ClientRequest | null;
  /** Wait before the next #checkLater; doubles while checks keep failing, back to 0 once output flows. */
  retryMs: number;
}

export class DockerDriver implements RuntimeDriver {
  readonly name = "docker";
  readonly #socketPath: string;
  readonly #image: string;
  readonly #logger: Logger | undefined;
  readonly #replicas = new Map<string, Replica>();
  readonly #exitListeners: Array<(state: ReplicaState) => void> = [];
  readonly #outputListeners: Array<(line: OutputLine) => void> = [];
  /** Containers the engine reported an `oom` event for; the event comes before their `die`. */
  readonly #oomSeen = new Set<string>();
  readonly #timers = new Set<NodeJS.Timeout>();
  /** Replicas inside start(): a second start would find the first one's container and replace it. */
  readonly #starting = new Set<string>();
  #apiVersion: Promise<string> | null = null;
  #pull: Promise<void> | null = null;
  #events: Promise<void> | null = null;
  #eventsRequest: http.ClientRequest | null = null;
  #closed = false;

  constructor(opts: DockerDriverOptions) {
    this.#socketPath = opts.socketPath;
    this.#image = opts.image ?? DEFAULT_IMAGE;
    this.#logger = opts.logger;
  }

  async start(spec: ReplicaSpec): Promise<ReplicaState> {
    this.#assertOpen();
    const previous = this.#replicas.get(spec.id);
    if (previous?.state.running || this.#starting.has(spec.id)) throw new Error(`replica ${spec.id} is already running`);
    this.#starting.add(spec.id);
    try {
      return await this.#start(spec, previous);
    } finally {
      this.#starting.delete(spec.id);
    }
  }

  async #start(spec: ReplicaSpec, previous: Replica | undefined): Promise<ReplicaState> {
    // Watching before the container exists, so that no exit can happen unseen.
    await this.#watchEvents();
    await this.#ensureImage();
    const handle = await this.#create(spec);
    if (previous) this.#unfollow(previous);
    const record: Replica = {
      state: { spec, handle, startedAt: new Date(), running: true, exit: null },
      stopRequested: false,
      exiting: null,
      logs: null,
      retryMs: 0,
    };
    // Registered before the start so that a `die` right after it finds its replica.
    this.#replicas.set(spec.id, record);
    try {
      await this.#call({ method: "POST", path: `/containers/${handle}/start` }, { ok: [304] });
    } catch (err) {
      this.#replicas.delete(spec.id);
      await this.#call({ method: "DELETE", path: `/containers/${handle}`, query: { force: true } }, { ok: [404, 409] }).catch(() => {});
      throw err;
    }
    record.state.startedAt = new Date();
    void this.#follow(record);
    return snapshot(record);
  }

  async stop(replicaId: string, graceMs: number): Promise<void> {
    const record = this.#replicas.get(replicaId);
    if (record) record.stopRequested = true;
    const ref = record?.state.handle ?? encodeURIComponent(containerName(replicaId));
    const seconds = Math.max(0, Math.ceil(graceMs / 1000));
    // The engine answers once the container is gone, after up to `t` seconds of grace.
    await this.#call({ method: "POST", path: `/containers/${ref}/stop`, query: { t: seconds } }, { ok: [304, 404], idleMs: seconds * 1000 + REQUEST_IDLE_MS });
    if (record && this.#replicas.get(replicaId) === record && record.state.running) await this.#recordExit(record);
  }

  list(): ReplicaState[] {
    return [...this.#replicas.values()].map(snapshot);
  }

  async remove(replicaId: string): Promise<void> {
    const record = this.#replicas.get(replicaId);
    if (record) {
      record.stopRequested = true;
      this.#unfollow(record);
    }
    const ref = record?.state.handle ?? encodeURIComponent(containerName(replicaId));
    // 409: a removal of the same container is already under way.
    await this.#call({ method: "DELETE", path: `/containers/${ref}`, query: { force: true } }, { ok: [404, 409] });
    if (record && this.#replicas.get(replicaId) === record) this.#replicas.delete(replicaId);
  }

  async tail(replicaId: string, n = 30): Promise<string[]> {
    if (n <= 0) return [];
    const ref = this.#replicas.get(replicaId)?.state.handle ?? encodeURIComponent(containerName(replicaId));
    const reply = await this.#call(
      { method: "GET", path: `/containers/${ref}/logs`, query: { stdout: 1, stderr: 1, timestamps: 0, tail: n } },
      { ok: [404] },
    );
    if (reply.status === 404) return [];
    const demuxer = new LogDemuxer();
    const lines = [...demuxer.push(reply.body), ...demuxer.end()].filter((l) => l.stream !== "system").map((l) => l.line);
    return lines.slice(-n);
  }

  onExit(listener: (state: ReplicaState) => void): void {
    this.#exitListeners.push(listener);
  }

  onOutput(listener: (line: OutputLine) => void): void {
    this.#outputListeners.push(listener);
  }

  async adopt(): Promise<ReplicaState[]> {
    this.#assertOpen();
    await this.#watchEvents();
    const reply = await this.#call({
      method: "GET",
      path: "/containers/json",
      query: { all: 1, filters: { label: [LABELS.replica] } },
    });
    const containers = JSON.parse(reply.body.toString("utf8")) as ContainerSummary[];
    const adopted: ReplicaState[] = [];
    const since = Math.floor(Date.now() / 1000);
    for (const container of containers) {
      const spec = specFromLabels(container.Labels);
      if (!spec) {
        this.#logger?.warn({ container: container.Id }, "docker: a platform container without a readable spec label is left alone");
        continue;
      }
      const known = this.#replicas.get(spec.id);
      if (known?.state.handle === container.Id) {
        adopted.push(snapshot(known));
        continue;
      }
      const info = await this.#inspect(container.Id);
      if (!info) continue;
      const running = info.State.Running;
      const record: Replica = {
        state: {
          spec,
          handle: container.Id,
          startedAt: engineDate(info.State.StartedAt),
          running,
          exit: running ? null : exitFromInspect(info, false),
        },
        stopRequested: false,
        exiting: null,
        logs: null,
        retryMs: 0,
      };
      this.#replicas.set(spec.id, record);
      if (running) void this.#follow(record, since);
      adopted.push(snapshot(record));
    }
    return adopted;
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    const events = this.#eventsRequest;
    this.#eventsRequest = null;
    events?.destroy();
    for (const record of this.#replicas.values()) this.#unfollow(record);
  }

  // -- engine calls

  async #call(req: EngineRequest, opts: { ok?: number[]; idleMs?: number } = {}): Promise<Reply> {
    const version = await this.#version();
    const reply = await send(this.#socketPath, buildRequest(version, req), opts.idleMs ?? REQUEST_IDLE_MS);
    if ((reply.status < 200 || reply.status >= 300) && !opts.ok?.includes(reply.status)) {
      throw new DockerError(reply.status, `${req.method} ${req.path}: ${engineMessage(reply.body)}`);
    }
    return reply;
  }

  #version(): Promise<string> {
    if (!this.#apiVersion) {
      const asked = send(this.#socketPath, buildRequest(null, { method: "GET", path: "/version" }), REQUEST_IDLE_MS).then((reply) => {
        if (reply.status !== 200) throw new DockerError(reply.status, `GET /version: ${engineMessage(reply.body)}`);
        return negotiateApiVersion((JSON.parse(reply.body.toString("utf8")) as { ApiVersion?: unknown }).ApiVersion);
      });
      // An engine that was down is asked again next time rather than never.
      asked.catch(() => {
        if (this.#apiVersion === asked) this.#apiVersion = null;
      });
      this.#apiVersion = asked;
    }
    return this.#apiVersion;
  }

  async #inspect(ref: string): Promise<ContainerInspect | null> {
    const reply = await this.#call({ method: "GET", path: `/containers/${ref}/json` }, { ok: [404] });
    return reply.status === 404 ? null : (JSON.parse(reply.body.toString("utf8")) as ContainerInspect);
  }

  #ensureImage(): Promise<void> {
    if (!this.#pull) {
      const pulling = this.#pullIfMissing();
      this.#pull = pulling;
      // Only a pull in flight is shared: the next start checks again (the image may have been pruned).
      const done = () => {
        if (this.#pull === pulling) this.#pull = null;
      };
      pulling.then(done, done);
    }
    return this.#pull;
  }

  async #pullIfMissing(): Promise<void> {
    const found = await this.#call({ method: "GET", path: `/images/${encodeURI(this.#image)}/json` }, { ok: [404] });
    if (found.status !== 404) return;
    this.#logger?.info({ image: this.#image }, "docker: pulling the base image");
    const reply = await this.#call({ method: "POST", path: "/images/create", query: splitImageRef(this.#image) }, { idleMs: PULL_IDLE_MS });
    // A failed pull still answers 200: the failure is the last progress line.
    for (const line of splitLines(Buffer.alloc(0), reply.body, Number.POSITIVE_INFINITY).lines) {
      if (!line.trim()) continue;
      let progress: { error?: unknown };
      try {
        progress = JSON.parse(line) as { error?: unknown };
      } catch {
        continue;
      }
      if (typeof progress.error === "string") throw new DockerError(500, `pull ${this.#image}: ${progress.error}`);
    }
  }

  async #create(spec: ReplicaSpec): Promise<string> {
    const name = containerName(spec.id);
    const create = { method: "POST", path: "/containers/create", query: { name }, body: containerConfig(spec, this.#image) } as const;
    let reply = await this.#call(create, { ok: [409] });
    if (reply.status === 409) {
      // The name is taken by an earlier container of this replica; one still running is not ours to kill.
      const old = await this.#inspect(encodeURIComponent(name));
      if (old?.State.Running) throw new Error(`container ${name} is already running`);
      await this.#call({ method: "DELETE", path: `/containers/${encodeURIComponent(name)}`, query: { force: true } }, { ok: [404] });
      reply = await this.#call(create);
    }
    return (JSON.parse(reply.body.toString("utf8")) as { Id: string }).Id;
  }

  // -- events

  /** Resolves once the event stream is connected for the first time; later drops reconnect on their own. */
  #watchEvents(): Promise<void> {
    if (!this.#events) {
      const connecting = this.#connectEvents();
      connecting.catch(() => {
        if (this.#events === connecting) this.#events = null;
      });
      this.#events = connecting;
    }
    return this.#events;
  }

  async #connectEvents(): Promise<void> {
    const { req, response } = openStream(
      this.#socketPath,
      buildRequest(await this.#version(), {
        method: "GET",
        path: "/events",
        query: { filters: { label: [LABELS.replica], type: ["container"] } },
      }),
      REQUEST_IDLE_MS,
    );
    const res = await response;
    if (this.#closed) {
      req.destroy();
      return;
    }
    this.#eventsRequest = req;
    let pending: Buffer = Buffer.alloc(0);
    res.on("data", (chunk: Buffer) => {
      const { lines, rest } = splitLines(pending, chunk, Number.POSITIVE_INFINITY);
      pending = Buffer.from(rest);
      for (const line of lines) if (line.trim()) this.#onEvent(line);
    });
    res.on("error", () => {});
    res.on("close", () => {
      if (this.#eventsRequest !== req) return;
      this.#eventsRequest = null;
      this.#logger?.warn("docker: the event stream dropped; reconnecting");
      // An exit during the gap is not lost: its log stream ends too, and that is checked (#checkLater).
      this.#reconnectEvents(0);
    });
  }

  #reconnectEvents(attempt: number): void {
    this.#later(Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** attempt), () => {
      this.#connectEvents().catch((err: unknown) => {
        this.#logger?.warn({ err }, "docker: the event stream cannot reconnect yet");
        this.#reconnectEvents(attempt + 1);
      });
    });
  }

  #onEvent(line: string): void {
    let event: EngineEvent;
    try {
      event = JSON.parse(line) as EngineEvent;
    } catch {
      this.#logger?.warn({ line: line.slice(0, 200) }, "docker: an event line that is not JSON was ignored");
      return;
    }
    const containerId = event.Actor?.ID;
    if (event.Type !== "container" || !containerId) return;
    if (event.Action === "oom") {
      this.#oomSeen.add(containerId);
      return;
    }
    if (event.Action !== "die") return;
    const record = this.#replicas.get(event.Actor?.Attributes?.[LABELS.replica] ?? "");
    if (!record || record.state.handle !== containerId || !record.state.running) {
      this.#oomSeen.delete(containerId);
      return;
    }
    void this.#recordExit(record);
  }

  /** Records the exit of a replica's container and reports it unless stop() or remove() asked for it. */
  #recordExit(record: Replica): Promise<void> {
    record.exiting ??= this.#settleExit(record).finally(() => {
      record.exiting = null;
    });
    return record.exiting;
  }

  async #settleExit(record: Replica): Promise<void> {
    const handle = record.state.handle;
    let info: ContainerInspect | null;
    try {
      info = await this.#inspect(handle);
    } catch (err) {
      this.#logger?.warn({ err, replica: record.state.spec.id }, "docker: cannot inspect a container that died; asking again");
      this.#checkLater(record);
      return;
    }
    if (info?.State.Running) return;
    const oomEvent = this.#oomSeen.delete(handle);
    // Gone already (removed with force by someone else): its exit code went with it.
    const exit: ExitInfo = info ? exitFromInspect(info, oomEvent) : { code: null, signal: null, oomKilled: oomEvent, at: new Date() };
    if (this.#replicas.get(record.state.spec.id) !== record || !record.state.running) return;
    record.state.running = false;
    record.state.exit = exit;
    if (record.stopRequested) return;
    const state = snapshot(record);
    for (const listener of this.#exitListeners) {
      try {
        listener(state);
      } catch (err) {
        this.#logger?.error({ err }, "docker: an exit listener threw");
      }
    }
  }

  // -- output

  async #follow(record: Replica, since?: number): Promise<void> {
    const replicaId = record.state.spec.id;
    let req: http.ClientRequest | null = null;
    try {
      const version = await this.#version();
      if (this.#closed || this.#replicas.get(replicaId) !== record || record.logs) return;
      const stream = openStream(
        this.#socketPath,
        buildRequest(version, {
          method: "GET",
          path: `/containers/${record.state.handle}/logs`,
          query: { follow: 1, stdout: 1, stderr: 1, timestamps: 0, since },
        }),
        null,
      );
      req = stream.req;
      // Held before the engine answers, so that remove() and close() can abort a stream still waiting.
      record.logs = req;
      const res = await stream.response;
      const demuxer = new LogDemuxer();
      res.on("data", (chunk: Buffer) => {
        record.retryMs = 0;
        this.#emit(record.state.spec, demuxer.push(chunk));
      });
      res.on("end", () => this.#emit(record.state.spec, demuxer.end()));
      res.on("error", () => {});
      res.on("close", () => {
        if (record.logs !== req) return;
        record.logs = null;
        // Ends when the container stops, and also when the engine restarts: which one, the engine says.
        if (record.state.running) this.#checkLater(record);
      });
    } catch (err) {
      // Aborted by remove() or close(), or another stream took over: nothing to retry.
      if (req ? record.logs !== req : record.logs !== null) return;
      record.logs = null;
      this.#logger?.warn({ err, replica: replicaId }, "docker: cannot follow a replica's output");
      if (record.state.running) this.#checkLater(record);
    }
  }

  #emit(spec: ReplicaSpec, lines: DemuxedLine[]): void {
    const replicaId = spec.id;
    for (const { stream, line } of lines) {
      if (stream === "system") {
        this.#logger?.warn({ replica: replicaId, detail: line }, "docker: the engine reported a log stream error");
        continue;
      }
      const output: OutputLine = { replicaId, spec, stream, line, at: new Date() };
      for (const listener of this.#outputListeners) {
        try {
          listener(output);
        } catch (err) {
          this.#logger?.error({ err }, "docker: an output listener threw");
        }
      }
    }
  }

  #unfollow(record: Replica): void {
    const logs = record.logs;
    record.logs = null;
    logs?.destroy();
  }

  /** After a lost stream: still running means follow again from now, stopped means an exit to record. */
  #checkLater(record: Replica): void {
    const delayMs = record.retryMs;
    record.retryMs = Math.min(RECONNECT_MAX_MS, Math.max(RECONNECT_MIN_MS, delayMs * 2));
    this.#later(delayMs, () => {
      if (this.#replicas.get(record.state.spec.id) !== record || !record.state.running || record.logs) return;
      this.#inspect(record.state.handle).then(
        (info) => {
          if (this.#closed || this.#replicas.get(record.state.spec.id) !== record || !record.state.running || record.logs) return;
          if (info?.State.Running) void this.#follow(record, Math.floor(Date.now() / 1000));
          else void this.#recordExit(record);
        },
        () => this.#checkLater(record),
      );
    });
  }

  #later(delayMs: number, fn: () => void): void {
    if (this.#closed) return;
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      if (!this.#closed) fn();
    }, delayMs);
    timer.unref();
    this.#timers.add(timer);
  }

  #assertOpen(): void {
    if (this.#closed) throw new Error("the docker runtime driver is closed");
  }
}

function snapshot(record: Replica): ReplicaState {
  return { ...record.state };
}
