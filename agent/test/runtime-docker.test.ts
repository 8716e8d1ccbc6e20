/**
 * The docker runtime driver in three tiers: its pure parts (the multiplexed-stream demuxer, the
 * labels that carry the spec, the request builder); the driver against a small fake engine on a
 * unix socket, which speaks the few endpoints the driver uses so that exits, stops, reconnects
 * and adoption run on any machine; and the driver against a real Docker engine, only where one
 * answers on /var/run/docker.sock.
 */
import { afterAll, afterEach, assert, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { freePort } from "@platform/testing";
import {
  API_VERSION,
  DockerDriver,
  LABELS,
  LogDemuxer,
  buildRequest,
  containerConfig,
  containerName,
  engineAnswers,
  negotiateApiVersion,
  readFrames,
  specFromLabels,
  specLabels,
  splitImageRef,
  splitLines,
  type DemuxedLine,
} from "../src/runtime/docker.ts";
import type { OutputLine, ReplicaSpec, ReplicaState } from "../src/runtime/types.ts";

const DOCKER_SOCKET = "/var/run/docker.sock";

function frame(type: number, text: string | Buffer): Buffer {
  const payload = typeof text === "string" ? Buffer.from(text) : text;
  const header = Buffer.alloc(8);
  header[0] = type;
  header.writeUInt32BE(payload.length, 4);
  return Buffer.concat([header, payload]);
}

function makeSpec(overrides: Partial<ReplicaSpec> = {}): ReplicaSpec {
  const id = overrides.id ?? `acme.shop.main.web.blue.${randomBytes(3).toString("hex")}`;
  return {
    id,
    group: "acme",
    app: "shop",
    branch: "main",
    service: "web",
    colour: "blue",
    index: 0,
    tag: "main-abc1234",
    releaseDir: "/srv/releases/shop/main-abc1234",
    command: "node server.js",
    env: { NODE_ENV: "production", PLATFORM_APP: "shop" },
    port: 4100,
    memoryMb: 256,
    ...overrides,
  };
}

async function waitFor<T>(probe: () => T | Promise<T>, what: string, timeoutMs = 5_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("the multiplexed stream", () => {
  const stream = Buffer.concat([
    frame(1, "one\ntw"),
    frame(2, "err1\n"),
    frame(1, "o\nthree\n"),
    frame(2, "partial"),
  ]);
  const expected: DemuxedLine[] = [
    { stream: "stdout", line: "one" },
    { stream: "stderr", line: "err1" },
    { stream: "stdout", line: "two" },
    { stream: "stdout", line: "three" },
  ];

  it("frames split across chunks at any size give the same lines, stdout and stderr interleaved in order", () => {
    for (let size = 1; size <= stream.length; size++) {
      const demuxer = new LogDemuxer();
      const lines: DemuxedLine[] = [];
      for (let offset = 0; offset < stream.length; offset += size) lines.push(...demuxer.push(stream.subarray(offset, offset + size)));
      expect(lines, `chunks of ${size} bytes`).toEqual(expected);
      expect(demuxer.end()).toEqual([{ stream: "stderr", line: "partial" }]);
    }
  });

  it("a partial line of one stream waits while the other stream's lines go by", () => {
    const demuxer = new LogDemuxer();
    expect(demuxer.push(frame(1, "start of a "))).toEqual([]);
    expect(demuxer.push(frame(2, "warning\n"))).toEqual([{ stream: "stderr", line: "warning" }]);
    expect(demuxer.push(frame(1, "long line\r\nnext"))).toEqual([{ stream: "stdout", line: "start of a long line" }]);
    expect(demuxer.end()).toEqual([{ stream: "stdout", line: "next" }]);
    expect(demuxer.end()).toEqual([]);
  });

  it("a character split across two frames is decoded whole", () => {
    const bytes = Buffer.from("héllo wörld\n");
    const cut = bytes.indexOf(0xc3) + 1;
    const demuxer = new LogDemuxer();
    expect([...demuxer.push(frame(1, bytes.subarray(0, cut))), ...demuxer.push(frame(1, bytes.subarray(cut)))]).toEqual([
      { stream: "stdout", line: "héllo wörld" },
    ]);
  });

  it("readFrames keeps an incomplete header or payload for the next chunk; type 0 is stdout, 3 the engine's own", () => {
    const whole = Buffer.concat([frame(0, "in\n"), frame(3, "boom\n"), frame(1, "tail")]);
    const first = readFrames(whole.subarray(0, whole.length - 2));
    expect(first.frames.map((f) => [f.stream, f.payload.toString()])).toEqual([
      ["stdout", "in\n"],
      ["system", "boom\n"],
    ]);
    expect(first.rest.length).toBe(8 + 2);
    expect(readFrames(whole.subarray(0, 5))).toMatchObject({ frames: [], rest: whole.subarray(0, 5) });
  });

  it("a line without a newline is cut at the limit rather than held forever", () => {
    const { lines, rest } = splitLines(Buffer.from("ab"), Buffer.from("cdefg"), 3);
    expect(lines).toEqual(["abc", "def"]);
    expect(rest.toString()).toBe("g");
  });
});

describe("labels and the container", () => {
  it("the spec round-trips through the labels; the filter labels name the replica", () => {
    const spec = makeSpec({ port: null, memoryMb: null, env: { A: "1", QUOTE: 'say "hi"\nbye' } });
    const labels = specLabels(spec);
    expect(labels).toMatchObject({
      [LABELS.replica]: spec.id,
      [LABELS.app]: "shop",
      [LABELS.branch]: "main",
      [LABELS.group]: "acme",
      [LABELS.service]: "web",
      [LABELS.colour]: "blue",
    });
    expect(specFromLabels(JSON.parse(JSON.stringify(labels)) as Record<string, string>)).toEqual(spec);
    expect(specFromLabels(specLabels(makeSpec()))).toEqual(expect.objectContaining({ port: 4100, memoryMb: 256 }));
  });

  it("labels this driver did not write are refused", () => {
    const labels = specLabels(makeSpec());
    expect(specFromLabels(undefined)).toBeNull();
    expect(specFromLabels({ [LABELS.replica]: "x" })).toBeNull();
    expect(specFromLabels({ ...labels, [LABELS.spec]: "{not json" })).toBeNull();
    expect(specFromLabels({ ...labels, [LABELS.replica]: "another" })).toBeNull();
    const broken = { ...JSON.parse(labels[LABELS.spec]!), colour: "red" };
    expect(specFromLabels({ ...labels, [LABELS.spec]: JSON.stringify(broken) })).toBeNull();
    const noEnv = { ...JSON.parse(labels[LABELS.spec]!), env: { A: 1 } };
    expect(specFromLabels({ ...labels, [LABELS.spec]: JSON.stringify(noEnv) })).toBeNull();
  });

  it("the create body: the release at /app, sh -c, PORT, host network, the memory limit, no restarts", () => {
    const spec = makeSpec({ env: { PORT: "1", FOO: "bar=baz" } });
    const body = containerConfig(spec, "node:24-slim");
    expect(body).toMatchObject({
      Image: "node:24-slim",
      Cmd: ["sh", "-c", "node server.js"],
      WorkingDir: "/app",
      Labels: specLabels(spec),
      Tty: false,
      HostConfig: {
        Mounts: [{ Type: "bind", Source: spec.releaseDir, Target: "/app" }],
        NetworkMode: "host",
        RestartPolicy: { Name: "no" },
        Memory: 256 * 1024 * 1024,
        MemorySwap: 256 * 1024 * 1024,
      },
    });
    expect(body.Env).toEqual(["PORT=4100", "FOO=bar=baz"]);
    const background = containerConfig(makeSpec({ port: null, memoryMb: null, env: {} }), "img");
    expect(background.Env).toEqual([]);
    expect(background.HostConfig).not.toHaveProperty("Memory");
  });
});

describe("requests", () => {
  it("prefixes the API version, encodes filters as JSON and leaves undefined out", () => {
    const built = buildRequest("1.43", {
      method: "GET",
      path: "/events",
      query: { filters: { label: ["platform.replica"], type: ["container"] }, since: undefined, all: 1 },
    });
    expect(built.method).toBe("GET");
    expect(built.body).toBeNull();
    const url = new URL(built.path, "http://docker");
    expect(url.pathname).toBe("/v1.43/events");
    expect(JSON.parse(url.searchParams.get("filters")!)).toEqual({ label: ["platform.replica"], type: ["container"] });
    expect(url.searchParams.has("since")).toBe(false);
    expect(url.searchParams.get("all")).toBe("1");
  });

  it("a body is JSON with its length; /_ping and /version are unversioned", () => {
    const built = buildRequest("1.41", { method: "POST", path: "/containers/create", query: { name: "platform-x" }, body: { Image: "é" } });
    expect(built.path).toBe("/v1.41/containers/create?name=platform-x");
    expect(built.headers["content-type"]).toBe("application/json");
    expect(built.headers["content-length"]).toBe(String(Buffer.byteLength(built.body!)));
    expect(buildRequest(null, { method: "GET", path: "/_ping" }).path).toBe("/_ping");
  });

  it("negotiates down to an older engine, never up", () => {
    expect(negotiateApiVersion("1.41")).toBe("1.41");
    expect(negotiateApiVersion("1.9")).toBe("1.9");
    expect(negotiateApiVersion("1.47")).toBe(API_VERSION);
    expect(negotiateApiVersion("2.0")).toBe(API_VERSION);
    expect(negotiateApiVersion(undefined)).toBe(API_VERSION);
    expect(negotiateApiVersion("latest")).toBe(API_VERSION);
  });

  it("splits an image reference into fromImage and tag", () => {
    expect(splitImageRef("node:24-slim")).toEqual({ fromImage: "node", tag: "24-slim" });
    expect(splitImageRef("node")).toEqual({ fromImage: "node", tag: "latest" });
    expect(splitImageRef("localhost:5000/app")).toEqual({ fromImage: "localhost:5000/app", tag: "latest" });
    expect(splitImageRef("localhost:5000/app:2")).toEqual({ fromImage: "localhost:5000/app", tag: "2" });
    expect(splitImageRef("node@sha256:abc")).toEqual({ fromImage: "node", tag: "sha256:abc" });
  });
});

// ---------------------------------------------------------------------------------------------
// A fake engine: the endpoints the driver uses, with the engine's status codes and stream formats.

interface FakeContainer {
  id: string;
  name: string;
  config: Record<string, unknown> & { Labels: Record<string, string> };
  running: boolean;
  exitCode: number;
  oomKilled: boolean;
  startedAt: string;
  finishedAt: string;
  logs: Array<{ type: number; data: Buffer; at: number }>;
  followers: Set<http.ServerResponse>;
}

const ZERO_TIME = "0001-01-01T00:00:00Z";

class FakeEngine {
  apiVersion = "1.43";
  refuseEvents = false;
  readonly images = new Set<string>();
  readonly containers = new Map<string, FakeContainer>();
  readonly requests: string[] = [];
  readonly eventStreams = new Set<http.ServerResponse>();
  readonly #server = http.createServer((req, res) => void this.#handle(req, res));
  readonly socketPath: string;

  constructor(dir: string) {
    this.socketPath = path.join(dir, "docker.sock");
  }

  listen(): Promise<void> {
    return new Promise((resolve) => this.#server.listen(this.socketPath, resolve));
  }

  close(): Promise<void> {
    this.#server.closeAllConnections();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }

  find(ref: string): FakeContainer | undefined {
    return this.containers.get(ref) ?? [...this.containers.values()].find((c) => c.name === ref);
  }

  byReplica(replicaId: string): FakeContainer {
    const container = this.find(containerName(replicaId));
    if (!container) throw new Error(`no container for ${replicaId}`);
    return container;
  }

  /** Writes output; `bytewise` sends the frame one byte at a time, as a slow connection might. */
  write(replicaId: string, type: 1 | 2, text: string, bytewise = false): void {
    const container = this.byReplica(replicaId);
    const data = Buffer.from(text);
    container.logs.push({ type, data, at: Math.floor(Date.now() / 1000) });
    const bytes = frame(type, data);
    for (const res of container.followers) {
      if (bytewise) for (let i = 0; i < bytes.length; i++) res.write(bytes.subarray(i, i + 1));
      else res.write(bytes);
    }
  }

  exit(replicaId: string, code: number, oom = false): void {
    this.#die(this.byReplica(replicaId), code, oom);
  }

  dropEvents(): void {
    for (const res of this.eventStreams) res.destroy();
    this.eventStreams.clear();
  }

  addContainer(name: string, labels: Record<string, string>): void {
    const id = randomBytes(32).toString("hex");
    this.containers.set(id, {
      id,
      name,
      config: { Labels: labels },
      running: true,
      exitCode: 0,
      oomKilled: false,
      startedAt: new Date().toISOString(),
      finishedAt: ZERO_TIME,
      logs: [],
      followers: new Set(),
    });
  }

  #event(container: FakeContainer, action: string, extra: Record<string, string> = {}): void {
    const now = Date.now();
    const line = JSON.stringify({
      Type: "container",
      Action: action,
      Actor: { ID: container.id, Attributes: { ...container.config.Labels, name: container.name, ...extra } },
      time: Math.floor(now / 1000),
      timeNano: now * 1e6,
    });
    for (const res of this.eventStreams) res.write(`${line}\n`);
  }

  #die(container: FakeContainer, code: number, oom: boolean): void {
    container.running = false;
    container.exitCode = code;
    container.oomKilled = oom;
    container.finishedAt = new Date().toISOString();
    if (oom) this.#event(container, "oom");
    this.#event(container, "die", { exitCode: String(code) });
    for (const res of container.followers) res.end();
    container.followers.clear();
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const url = new URL(req.url ?? "/", "http://docker");
    this.requests.push(`${req.method} ${url.pathname}${url.search}`);
    const versioned = /^\/v(\d+\.\d+)(\/.*)$/.exec(url.pathname);
    const route = versioned?.[2] ?? url.pathname;
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(body === undefined ? "" : JSON.stringify(body));
    };
    const noSuch = () => json(404, { message: "No such container" });
    if (route === "/_ping") return void res.end("OK");
    if (route === "/version") return json(200, { ApiVersion: this.apiVersion, MinAPIVersion: "1.24" });
    if (!versioned) return json(400, { message: "unversioned" });

    let m: RegExpExecArray | null;
    if (req.method === "GET" && (m = /^\/images\/(.+)\/json$/.exec(route))) {
      return this.images.has(decodeURI(m[1]!)) ? json(200, { Id: "sha256:fake" }) : json(404, { message: "No such image" });
    }
    if (req.method === "POST" && route === "/images/create") {
      this.images.add(`${url.searchParams.get("fromImage")}:${url.searchParams.get("tag")}`);
      res.writeHead(200, { "content-type": "application/json" });
      return void res.end('{"status":"Pulling from library/node"}\n{"status":"Download complete"}\n');
    }
    if (req.method === "POST" && route === "/containers/create") {
      const name = url.searchParams.get("name") ?? "";
      if (this.find(name)) return json(409, { message: `Conflict. The container name "/${name}" is already in use` });
      const config = JSON.parse(Buffer.concat(chunks).toString()) as FakeContainer["config"];
      const id = randomBytes(32).toString("hex");
      this.containers.set(id, { id, name, config, running: false, exitCode: 0, oomKilled: false, startedAt: ZERO_TIME, finishedAt: ZERO_TIME, logs: [], followers: new Set() });
      return json(201, { Id: id, Warnings: [] });
    }
    if (req.method === "GET" && route === "/containers/json") {
      const filters = JSON.parse(url.searchParams.get("filters") ?? "{}") as { label?: string[] };
      const list = [...this.containers.values()].filter((c) => (filters.label ?? []).every((label) => label in c.config.Labels));
      return json(200, list.map((c) => ({ Id: c.id, Names: [`/${c.name}`], Labels: c.config.Labels, State: c.running ? "running" : "exited" })));
    }
    if (req.method === "GET" && route === "/events") {
      if (this.refuseEvents) return json(500, { message: "events unavailable" });
      res.writeHead(200, { "content-type": "application/json" });
      res.flushHeaders();
      this.eventStreams.add(res);
      res.on("close", () => this.eventStreams.delete(res));
      return;
    }
    if ((m = /^\/containers\/([^/]+)(\/[a-z]+)?$/.exec(route))) {
      const container = this.find(decodeURIComponent(m[1]!));
      const action = `${req.method} ${m[2] ?? ""}`;
      if (!container) return noSuch();
      switch (action) {
        case "POST /start":
          if (container.running) return json(304, undefined);
          container.running = true;
          container.startedAt = new Date().toISOString();
          this.#event(container, "start");
          return json(204, undefined);
        case "POST /stop":
          if (!container.running) return json(304, undefined);
          this.#die(container, 143, false);
          return json(204, undefined);
        case "DELETE ":
          if (container.running) this.#die(container, 137, false);
          this.containers.delete(container.id);
          return json(204, undefined);
        case "GET /json":
          return json(200, {
            Id: container.id,
            Name: `/${container.name}`,
            State: {
              Running: container.running,
              ExitCode: container.exitCode,
              OOMKilled: container.oomKilled,
              StartedAt: container.startedAt,
              FinishedAt: container.finishedAt,
            },
            Config: { Labels: container.config.Labels, Tty: false },
          });
        case "GET /logs": {
          const since = Number(url.searchParams.get("since") ?? 0);
          const tail = url.searchParams.get("tail");
          let entries = container.logs.filter((e) => e.at >= since);
          if (tail !== null && tail !== "all") entries = entries.slice(-Number(tail));
          // Headers go out with the first frame, as engines before 25.0.4 do (moby#47448).
          res.writeHead(200, { "content-type": "application/vnd.docker.multiplexed-stream" });
          for (const entry of entries) res.write(frame(entry.type, entry.data));
          if (url.searchParams.get("follow") === "1" && container.running) {
            container.followers.add(res);
            res.on("close", () => container.followers.delete(res));
          } else {
            res.end();
          }
          return;
        }
      }
    }
    json(404, { message: `page not found: ${req.method} ${route}` });
  }
}

describe("DockerDriver against a fake engine", () => {
  let dir: string;
  let engine: FakeEngine;
  const drivers: DockerDriver[] = [];
  let exits: ReplicaState[];
  let output: OutputLine[];

  function newDriver(): DockerDriver {
    const driver = new DockerDriver({ socketPath: engine.socketPath, runDir: dir });
    drivers.push(driver);
    return driver;
  }

  function watched(): DockerDriver {
    const driver = newDriver();
    driver.onExit((state) => exits.push(state));
    driver.onOutput((line) => output.push(line));
    return driver;
  }

  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "agent-docker-test-"));
    engine = new FakeEngine(dir);
    await engine.listen();
    exits = [];
    output = [];
  });

  afterEach(async () => {
    await Promise.all(drivers.splice(0).map((d) => d.close()));
    await engine.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("start: negotiates the API version down, pulls the missing image once, creates and starts the container", async () => {
    engine.apiVersion = "1.41";
    const driver = watched();
    const [web, worker] = [makeSpec({ env: { PORT: "1", FOO: "bar" } }), makeSpec({ service: "worker", port: null, memoryMb: null })];
    const states = await Promise.all([driver.start(web), driver.start(worker)]);

    expect(engine.requests.filter((r) => r.startsWith("POST /v1.41/images/create"))).toEqual([
      "POST /v1.41/images/create?fromImage=node&tag=24-slim",
    ]);
    expect(engine.requests.filter((r) => r.startsWith("GET /version"))).toHaveLength(1);
    expect(engine.requests.filter((r) => !r.startsWith("GET /version")).every((r) => r.split(" ")[1]!.startsWith("/v1.41/"))).toBe(true);
    expect(engine.requests.some((r) => r.startsWith("GET /v1.41/events?filters="))).toBe(true);

    const container = engine.byReplica(web.id);
    expect(states[0]).toMatchObject({ spec: web, handle: container.id, running: true, exit: null });
    expect(container.running).toBe(true);
    expect(container.config).toMatchObject({
      Image: "node:24-slim",
      Cmd: ["sh", "-c", web.command],
      Env: ["PORT=4100", "FOO=bar"],
      WorkingDir: "/app",
      Labels: { [LABELS.replica]: web.id, [LABELS.service]: "web", [LABELS.spec]: JSON.stringify(web) },
      HostConfig: { NetworkMode: "host", Memory: 256 * 1024 * 1024, RestartPolicy: { Name: "no" } },
    });
    expect(driver.list().map((s) => s.spec.id).sort()).toEqual([web.id, worker.id].sort());

    await driver.start(makeSpec());
    expect(engine.requests.filter((r) => r.includes("/images/create"))).toHaveLength(1);
  });

  it("output: demultiplexed lines with their stream as they come; tail merges both streams in order", async () => {
    const driver = watched();
    const spec = makeSpec();
    await driver.start(spec);
    await waitFor(() => engine.byReplica(spec.id).followers.size === 1, "the log stream");
    engine.write(spec.id, 1, "hello\nwor", true);
    engine.write(spec.id, 2, "oops\n", true);
    engine.write(spec.id, 1, "ld\n");
    await waitFor(() => output.length === 3, "three lines");
    expect(output.map(({ replicaId, stream, line }) => ({ replicaId, stream, line }))).toEqual([
      { replicaId: spec.id, stream: "stdout", line: "hello" },
      { replicaId: spec.id, stream: "stderr", line: "oops" },
      { replicaId: spec.id, stream: "stdout", line: "world" },
    ]);
    expect(output[0]!.at).toBeInstanceOf(Date);

    engine.write(spec.id, 1, "four\n");
    engine.write(spec.id, 2, "five\n");
    expect(await driver.tail(spec.id, 2)).toEqual(["four", "five"]);
    expect(await driver.tail(spec.id)).toEqual(["hello", "oops", "world", "four", "five"]);
    expect(await driver.tail("nobody")).toEqual([]);
  });

  it("an exit that was not asked for is reported once, with its code; an OOM kill says so", async () => {
    const driver = watched();
    const [a, b] = [makeSpec(), makeSpec()];
    await driver.start(a);
    await driver.start(b);
    engine.exit(a.id, 3);
    await waitFor(() => exits.length === 1, "the first exit");
    expect(exits[0]).toMatchObject({ spec: a, running: false, exit: { code: 3, signal: null, oomKilled: false } });
    expect(exits[0]!.exit!.at).toBeInstanceOf(Date);

    engine.exit(b.id, 137, true);
    await waitFor(() => exits.length === 2, "the OOM kill");
    expect(exits[1]).toMatchObject({ spec: b, running: false, exit: { code: 137, oomKilled: true } });
    await sleep(200);
    expect(exits).toHaveLength(2);
    expect(driver.list().every((s) => !s.running)).toBe(true);
  });

  it("stop is recorded, not reported, and idempotent; remove forgets", async () => {
    const driver = watched();
    const spec = makeSpec();
    await driver.start(spec);
    await driver.stop(spec.id, 1_500);
    expect(engine.requests.some((r) => /^POST \/v1\.43\/containers\/[0-9a-f]{64}\/stop\?t=2$/.test(r))).toBe(true);
    expect(driver.list()).toEqual([expect.objectContaining({ running: false, exit: expect.objectContaining({ code: 143 }) })]);
    await driver.stop(spec.id, 1_000);
    await driver.stop("never-started", 1_000);
    await sleep(200);
    expect(exits).toEqual([]);

    await driver.remove(spec.id);
    expect(driver.list()).toEqual([]);
    expect(engine.containers.size).toBe(0);
    await driver.remove(spec.id);
    expect(await driver.tail(spec.id)).toEqual([]);
  });

  it("a dropped event stream reconnects; an exit while it is down is still reported, through the ended log stream", async () => {
    const driver = watched();
    const [a, b] = [makeSpec(), makeSpec()];
    await driver.start(a);
    await driver.start(b);
    await waitFor(() => engine.byReplica(a.id).followers.size === 1, "a's log stream");
    engine.refuseEvents = true;
    engine.dropEvents();
    engine.exit(a.id, 4);
    await waitFor(() => exits.length === 1, "the exit during the gap");
    expect(exits[0]).toMatchObject({ spec: a, exit: { code: 4 } });

    engine.refuseEvents = false;
    await waitFor(() => engine.eventStreams.size === 1, "the reconnected event stream", 10_000);
    engine.exit(b.id, 5);
    await waitFor(() => exits.length === 2, "the exit after reconnecting");
    expect(exits[1]).toMatchObject({ spec: b, exit: { code: 5 } });
  });

  it("start replaces a leftover container of an exited replica and refuses a running one", async () => {
    const driver = watched();
    const spec = makeSpec();
    const [first, twice] = await Promise.allSettled([driver.start(spec), driver.start(spec)]);
    expect(twice).toMatchObject({ status: "rejected", reason: expect.objectContaining({ message: expect.stringMatching(/already running/) }) });
    assert(first.status === "fulfilled");
    await expect(driver.start(spec)).rejects.toThrow(/already running/);
    engine.exit(spec.id, 1);
    await waitFor(() => exits.length === 1, "the exit");
    const second = await driver.start(spec);
    expect(second.handle).not.toBe(first.value.handle);
    expect(engine.containers.has(first.value.handle)).toBe(false);
    expect(driver.list()).toEqual([expect.objectContaining({ handle: second.handle, running: true })]);
  });

  it("adopt: a new driver rebuilds the replicas from the labels, follows their output and reports their exits", async () => {
    const first = watched();
    const [a, b] = [makeSpec({ colour: "green", index: 2 }), makeSpec()];
    const started = await first.start(a);
    await first.start(b);
    engine.exit(b.id, 5);
    await waitFor(() => exits.length === 1, "b's exit");
    engine.addContainer("platform-stranger", { [LABELS.replica]: "stranger", [LABELS.spec]: "{" });
    await first.close();
    expect(engine.byReplica(a.id).running).toBe(true);

    exits = [];
    output = [];
    const second = watched();
    const adopted = await second.adopt();
    const byId = new Map(adopted.map((s) => [s.spec.id, s]));
    expect(adopted).toHaveLength(2);
    expect(byId.get(a.id)).toMatchObject({ spec: a, handle: started.handle, running: true, exit: null });
    expect(byId.get(b.id)).toMatchObject({ spec: b, running: false, exit: { code: 5, oomKilled: false } });
    expect(second.list()).toHaveLength(2);

    await waitFor(() => engine.byReplica(a.id).followers.size === 1, "a's log stream");
    engine.write(a.id, 1, "after the restart\n");
    await waitFor(() => output.some((l) => l.line === "after the restart" && l.replicaId === a.id), "output through the new driver");
    engine.exit(a.id, 0);
    await waitFor(() => exits.length === 1, "a's exit through the new driver");
    expect(exits[0]).toMatchObject({ spec: a, exit: { code: 0 } });
  });

  it("close stops watching, not the replicas", async () => {
    const driver = watched();
    const spec = makeSpec();
    await driver.start(spec);
    await driver.close();
    await waitFor(() => engine.eventStreams.size === 0 && engine.byReplica(spec.id).followers.size === 0, "the streams to close");
    expect(engine.byReplica(spec.id).running).toBe(true);
    await expect(driver.start(makeSpec())).rejects.toThrow(/closed/);
  });
});

// ---------------------------------------------------------------------------------------------
// The real engine, where there is one.

const engine = await engineAnswers(DOCKER_SOCKET);

const SERVER_JS = `
const http = require("node:http");
const port = Number(process.env.PORT);
const server = http.createServer((req, res) => {
  console.log("request " + req.url);
  res.end("ok " + process.env.GREETING);
});
server.listen(port, "127.0.0.1", () => {
  console.log("listening on " + port);
  console.error("ready on stderr");
});
process.on("SIGTERM", () => {
  console.log("stopping");
  process.exit(0);
});
`;

describe(
  engine
    ? `DockerDriver against the Docker engine on ${DOCKER_SOCKET}`
    : `DockerDriver against the Docker engine (skipped: no Docker engine answers on ${DOCKER_SOCKET})`,
  () => {
    let releaseDir: string;
    const runDir = path.join(os.tmpdir(), "agent-docker-engine-run");
    const prefix = `t${process.pid}-${randomBytes(2).toString("hex")}`;
    const drivers: DockerDriver[] = [];
    const ids: string[] = [];
    const exits: ReplicaState[] = [];
    const output: OutputLine[] = [];
    let driver: DockerDriver;

    function spec(name: string, overrides: Partial<ReplicaSpec>): ReplicaSpec {
      const id = `${prefix}-${name}`;
      ids.push(id);
      return makeSpec({ id, service: name, releaseDir, command: "exec node server.js", env: { GREETING: "hi" }, memoryMb: null, ...overrides });
    }

    function newDriver(): DockerDriver {
      const d = new DockerDriver({ socketPath: DOCKER_SOCKET, runDir });
      drivers.push(d);
      return d;
    }

    async function get(port: number, urlPath = "/"): Promise<string | null> {
      try {
        const res = await fetch(`http://127.0.0.1:${port}${urlPath}`);
        return await res.text();
      } catch {
        return null;
      }
    }

    beforeAll(async () => {
      if (!engine) return;
      releaseDir = await mkdtemp(path.join(os.tmpdir(), "agent-docker-release-"));
      await writeFile(path.join(releaseDir, "server.js"), SERVER_JS);
      driver = newDriver();
      driver.onExit((state) => exits.push(state));
      driver.onOutput((line) => output.push(line));
    });

    afterAll(async () => {
      if (!engine) return;
      const cleaner = newDriver();
      await Promise.all(ids.map((id) => cleaner.remove(id).catch(() => {})));
      await Promise.all(drivers.map((d) => d.close()));
      await rm(releaseDir, { recursive: true, force: true });
    });

    let web: ReplicaSpec;

    it.skipIf(!engine)("starts a replica that answers HTTP on 127.0.0.1:<port>, with its output streamed", async () => {
      web = spec("web", { port: await freePort() });
      const state = await driver.start(web);
      expect(state).toMatchObject({ spec: web, running: true, exit: null });
      expect(state.handle).toMatch(/^[0-9a-f]{64}$/);
      expect(await waitFor(() => get(web.port!), "the replica to answer", 60_000)).toBe("ok hi");
      await waitFor(() => output.some((l) => l.replicaId === web.id && l.stream === "stdout" && l.line === `listening on ${web.port}`), "stdout");
      await waitFor(() => output.some((l) => l.replicaId === web.id && l.stream === "stderr" && l.line === "ready on stderr"), "stderr");
    }, 300_000);

    it.skipIf(!engine)("tail: the last lines of stdout and stderr merged in order", async () => {
      await waitFor(() => output.some((l) => l.replicaId === web.id && l.line === "request /"), "the request line");
      const lines = await driver.tail(web.id);
      expect(lines).toEqual(expect.arrayContaining([`listening on ${web.port}`, "ready on stderr", "request /"]));
      expect(lines.indexOf("request /")).toBeGreaterThan(lines.indexOf(`listening on ${web.port}`));
      expect(await driver.tail(web.id, 1)).toEqual([lines.at(-1)]);
    });

    it.skipIf(!engine)("stop: SIGTERM first, recorded but not reported, idempotent", async () => {
      await driver.stop(web.id, 10_000);
      expect(driver.list().find((s) => s.spec.id === web.id)).toMatchObject({ running: false, exit: { code: 0, oomKilled: false } });
      expect(await get(web.port!)).toBeNull();
      await driver.stop(web.id, 10_000);
      await sleep(500);
      expect(exits.filter((s) => s.spec.id === web.id)).toEqual([]);
      expect(await driver.tail(web.id)).toContain("stopping");
    }, 60_000);

    it.skipIf(!engine)("an exit with a code is reported, with the crash output in tail", async () => {
      const crash = spec("crash", { port: null, command: "echo bye; echo failing >&2; exit 7" });
      await driver.start(crash);
      const state = await waitFor(() => exits.find((s) => s.spec.id === crash.id), "the exit", 30_000);
      expect(state).toMatchObject({ running: false, exit: { code: 7, oomKilled: false } });
      expect(await driver.tail(crash.id)).toEqual(["bye", "failing"]);
    }, 60_000);

    it.skipIf(!engine)("reaching the memory limit is reported as an OOM kill", async () => {
      const hog = spec("hog", { port: null, memoryMb: 32, command: "tail /dev/zero" });
      await driver.start(hog);
      const state = await waitFor(() => exits.find((s) => s.spec.id === hog.id), "the OOM kill", 60_000);
      expect(state.exit).toMatchObject({ oomKilled: true });
    }, 90_000);

    it.skipIf(!engine)("adopt: a new driver takes over a running replica after the first one closed", async () => {
      const kept = spec("kept", { port: await freePort() });
      const started = await driver.start(kept);
      await waitFor(() => get(kept.port!), "the replica to answer", 60_000);
      await driver.close();

      const next = newDriver();
      const seen: OutputLine[] = [];
      const nextExits: ReplicaState[] = [];
      next.onOutput((line) => seen.push(line));
      next.onExit((state) => nextExits.push(state));
      const adopted = await next.adopt();
      expect(adopted.find((s) => s.spec.id === kept.id)).toMatchObject({ spec: kept, handle: started.handle, running: true });
      expect(adopted.find((s) => s.spec.id === web.id)).toMatchObject({ running: false });
      expect(await get(kept.port!, "/again")).toBe("ok hi");
      await waitFor(() => seen.some((l) => l.replicaId === kept.id && l.line === "request /again"), "output through the new driver", 10_000);
      await next.stop(kept.id, 10_000);
      expect(next.list().find((s) => s.spec.id === kept.id)).toMatchObject({ running: false });
      expect(nextExits).toEqual([]);
    }, 120_000);
  },
);
