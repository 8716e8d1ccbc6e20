import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { SERVICES } from "@platform/config";
import {
  DEFAULT_DATA_DIR,
  DEFAULT_DATABASE_URL,
  adminSocketUrl,
  caddyAdmin,
  DEFAULT_NATS_URL,
  FleetStartError,
  InfrastructureError,
  ROOT_KEY_PATTERN,
  ensureInfrastructure,
  formatLogLine,
  freePorts,
  isPortFree,
  loadOrCreateRootKey,
  portsFromList,
  probeCaddy,
  rootKeyFile,
  startFleet,
} from "@platform/fleet";

const databaseUrl = process.env.DATABASE_URL || DEFAULT_DATABASE_URL;
const natsUrl = process.env.NATS_URL || DEFAULT_NATS_URL;

describe("ensureInfrastructure", () => {
  it("returns at once, starting nothing, when the machine's Postgres and NATS answer", async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "fleet-infra-"));
    const began = Date.now();
    const infra = await ensureInfrastructure({ databaseUrl, natsUrl, dataDir, log: () => undefined });
    expect(infra.started).toEqual([]);
    expect(Date.now() - began).toBeLessThan(5000);
    await infra.stop();
    // Nothing was created under the data dir either.
    expect(fs.readdirSync(dataDir)).toEqual([]);
    fs.rmSync(dataDir, { recursive: true, force: true });
  });

  it("with keepRunning, starts the Caddy it started again when it dies, and stops it for good on stop()", async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "fleet-infra-"));
    const [routerPort] = await freePorts(1);
    // Its admin API on a socket, as npm start has it.
    const adminUrl = adminSocketUrl(path.join(dataDir, "caddy", "admin.sock"));
    const lines: string[] = [];
    const infra = await ensureInfrastructure({
      databaseUrl,
      natsUrl,
      router: { adminUrl, port: routerPort! },
      dataDir,
      log: (line) => lines.push(line),
      keepRunning: true,
    });
    try {
      expect(infra.started).toEqual(["caddy"]);
      // Caddy's own admin API ends it (exit code 0), as a crash would.
      await caddyAdmin(adminUrl, "POST", "/stop", { timeoutMs: 5_000 });
      await vi.waitUntil(() => lines.some((l) => l.includes("starting caddy again")), { timeout: 10_000, interval: 100 });
      // Said once its admin API answers again (which a probe of ours may see a moment earlier).
      await vi.waitUntil(() => lines.includes("caddy ready again"), { timeout: 30_000, interval: 100 });
      expect(await probeCaddy(adminUrl)).toBe(true);
    } finally {
      await infra.stop();
    }
    expect(await probeCaddy(adminUrl)).toBe(false);
    await new Promise((r) => setTimeout(r, 3000));
    expect(await probeCaddy(adminUrl)).toBe(false);
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
});

describe("loadOrCreateRootKey", () => {
  it("creates a pf_k1_ key once, stores it with mode 0600, and returns the same key afterwards", () => {
    const dataDir = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "fleet-key-")), ".data");
    const key = loadOrCreateRootKey(dataDir, {});
    expect(key).toMatch(ROOT_KEY_PATTERN);
    expect(key.length).toBe("pf_k1_".length + 43);
    const file = rootKeyFile(dataDir);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(fs.readFileSync(file, "utf8").trim()).toBe(key);
    expect(loadOrCreateRootKey(dataDir, {})).toBe(key);
    fs.rmSync(path.dirname(dataDir), { recursive: true, force: true });
  });

  it("prefers PLATFORM_ROOT_KEY and rejects a malformed one", () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "fleet-key-"));
    const key = `pf_k1_${"a".repeat(43)}`;
    expect(loadOrCreateRootKey(dataDir, { PLATFORM_ROOT_KEY: key })).toBe(key);
    expect(fs.existsSync(rootKeyFile(dataDir))).toBe(false);
    expect(() => loadOrCreateRootKey(dataDir, { PLATFORM_ROOT_KEY: "secret" })).toThrow(InfrastructureError);
    expect(() => loadOrCreateRootKey(dataDir, { PLATFORM_ROOT_KEY: "secret" })).toThrow(/PLATFORM_ROOT_KEY/);
    fs.rmSync(dataDir, { recursive: true, force: true });
  });

  it("forgets the stored key that PLATFORM_ROOT_KEY rotates out: the next start without it makes a new one", () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "fleet-key-"));
    const stored = loadOrCreateRootKey(dataDir, {});
    const key = `pf_k1_${"b".repeat(43)}`;
    expect(loadOrCreateRootKey(dataDir, { PLATFORM_ROOT_KEY: key })).toBe(key);
    expect(fs.existsSync(rootKeyFile(dataDir))).toBe(false);
    const next = loadOrCreateRootKey(dataDir, {});
    expect(next).not.toBe(stored);
    expect(next).not.toBe(key);
    // The same key in both places is left alone.
    expect(loadOrCreateRootKey(dataDir, { PLATFORM_ROOT_KEY: next })).toBe(next);
    expect(fs.readFileSync(rootKeyFile(dataDir), "utf8").trim()).toBe(next);
    fs.rmSync(dataDir, { recursive: true, force: true });
  });
});

describe("formatLogLine", () => {
  it("shows a pino line as time, level, message and fields", () => {
    const line = JSON.stringify({ level: "info", time: "2026-11-22T10:11:12.000Z", "service.name": "x", pid: 1, msg: "ready", port: 7001 });
    expect(formatLogLine(line)).toEqual(["10:11:12 INFO  ready port=7001"]);
    expect(formatLogLine("plain text")).toEqual(["plain text"]);
  });
});

/*
 * startFleet against stand-in processes: a scratch "repository" (under .data/ so that
 * `--import @platform/telemetry/register` resolves) whose entry points are tiny HTTP servers
 * reporting the environment they were given.
 */
const STUB = `
import http from "node:http";
const port = Number(process.env.PORT_VAR_VALUE);
const ready = process.env.READY_PATH;
if (process.env.FAIL_NOW) {
  for (let i = 1; i <= 50; i++) console.log("line " + i);
  console.error("boom: " + process.env.FAIL_NOW);
  process.exit(3);
}
http.createServer((req, res) => {
  if (req.url === ready) { res.writeHead(200); res.end("ok"); return; }
  if (req.url === "/env") { res.writeHead(200, { "content-type": "application/json" }); res.end(JSON.stringify(process.env)); return; }
  res.writeHead(404); res.end();
}).listen(port, "127.0.0.1", () => console.log(JSON.stringify({ level: "info", msg: "listening", port })));
process.on("SIGTERM", () => { console.log("got SIGTERM"); process.exit(0); });
`;

function writeStub(root: string, entry: string, portVar: string, readyPath: string, extra = ""): void {
  const file = path.join(root, entry);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(
    file,
    `process.env.PORT_VAR_VALUE = process.env.${portVar};\nprocess.env.READY_PATH = ${JSON.stringify(readyPath)};\n${extra}\n${STUB}`,
  );
}

function scratchRepo(failing?: string): string {
  fs.mkdirSync(DEFAULT_DATA_DIR, { recursive: true });
  const root = fs.mkdtempSync(path.join(DEFAULT_DATA_DIR, "fleet-selftest-"));
  for (const name of SERVICES) {
    writeStub(root, `services/${name}/src/main.ts`, "RPC_PORT", "/readyz", name === failing ? `process.env.FAIL_NOW = "${name}";` : "");
  }
  writeStub(root, "gateway/src/main.ts", "PORT", "/api/health");
  writeStub(root, "agent/src/main.ts", "AGENT_HEALTH_PORT", "/readyz");
  return root;
}

const scratch: string[] = [];
afterAll(() => {
  for (const dir of scratch) fs.rmSync(dir, { recursive: true, force: true });
});

describe("startFleet (stand-in processes)", () => {
  it("starts every process on its port, wires the URLs, gives identity the root key, and stops them all", async () => {
    const root = scratchRepo();
    scratch.push(root);
    const ports = portsFromList(await freePorts(SERVICES.length + 2 + 1), 2);
    const rootKey = `pf_k1_${"b".repeat(43)}`;
    const fleet = await startFleet({
      cwd: root,
      env: { ...process.env, BUS_PREFIX: "tselftest", PLATFORM_ROOT_KEY: "pf_k1_should_not_leak" },
      ports,
      rootKey,
      output: "collect",
      logDir: path.join(root, "logs"),
    });
    try {
      expect(fleet.processes.map((p) => p.name)).toEqual([...SERVICES, "gateway", "gateway-2", "agent"]);
      expect(fleet.gatewayUrls).toEqual(ports.gateways.map((p) => `http://127.0.0.1:${p}`));

      const envOf = async (name: string) => (await (await fetch(`${fleet.process(name)!.url}/env`)).json()) as Record<string, string>;
      const gateway = await envOf("gateway-2");
      expect(gateway.OTEL_SERVICE_NAME).toBe("gateway");
      expect(gateway.PORT).toBe(String(ports.gateways[1]));
      expect(gateway.IDENTITY_URL).toBe(`http://127.0.0.1:${ports.services.identity}`);
      expect(gateway.HEALTH_AGGREGATOR_URL).toBe(`http://127.0.0.1:${ports.services["health-aggregator"]}`);
      expect(gateway.BUS_PREFIX).toBe("tselftest");
      expect(gateway.PLATFORM_ROOT_KEY).toBeUndefined();
      const identity = await envOf("identity");
      expect(identity.PLATFORM_ROOT_KEY).toBe(rootKey);
      expect(identity.RPC_PORT).toBe(String(ports.services.identity));
      expect(identity.OTEL_SERVICE_NAME).toBe("identity");
      const agent = await envOf("agent");
      expect(agent.AGENT_HEALTH_PORT).toBe(String(ports.agent));
      expect(agent.DEPLOY_QUEUE_URL).toBe(`http://127.0.0.1:${ports.services["deploy-queue"]}`);
      expect(agent.PLATFORM_ROOT_KEY).toBeUndefined();
      expect(fleet.logs("mailer")).toContain('"msg":"listening"');
    } finally {
      await fleet.stop();
    }
    expect(fleet.processes.every((p) => !p.running())).toBe(true);
    expect(fleet.logs("storage")).toContain("got SIGTERM");
    expect(fs.readFileSync(path.join(root, "logs", "storage.log"), "utf8")).toContain("got SIGTERM");
    expect(await isPortFree(ports.services.identity)).toBe(true);
  });

  it("refuses to start on a port in use, naming the variable that moves the gateway", async () => {
    const root = scratchRepo();
    scratch.push(root);
    const ports = portsFromList(await freePorts(SERVICES.length + 2), 1);
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(ports.gateways[0], "127.0.0.1", resolve));
    try {
      const err = await startFleet({ cwd: root, env: { ...process.env }, ports, output: "collect" }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(FleetStartError);
      expect((err as Error).message).toBe(`port already in use: ${ports.gateways[0]} (gateway, set by PORT). Is another fleet (npm start) running?`);
    } finally {
      await new Promise((resolve) => blocker.close(resolve));
    }
  });

  it("fails with the last 40 lines of a process that exits during start, and stops the others", async () => {
    const root = scratchRepo("hooks");
    scratch.push(root);
    const ports = portsFromList(await freePorts(SERVICES.length + 2), 1);
    const err = await startFleet({ cwd: root, env: { ...process.env }, ports, output: "collect" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FleetStartError);
    const message = (err as Error).message;
    expect(message).toMatch(/hooks exited \(exit code 3\) before it was ready/);
    expect(message).toContain("boom: hooks");
    expect(message).toContain("line 50");
    expect(message).not.toContain("line 10\n");
    for (const name of SERVICES) expect(await isPortFree(ports.services[name])).toBe(true);
  });

  it("with restartOnExit, starts a process that died again on its port, and not once stop() began", async () => {
    const root = scratchRepo();
    scratch.push(root);
    const ports = portsFromList(await freePorts(SERVICES.length + 2), 1);
    const fleet = await startFleet({ cwd: root, env: { ...process.env }, ports, output: "collect", restartOnExit: true });
    try {
      const first = fleet.process("mailer")!;
      process.kill(first.pid!, "SIGKILL");
      await first.exited;
      await vi.waitUntil(
        async () => {
          const now = fleet.process("mailer")!;
          return now !== first && now.running() && (await fetch(`${now.url}/readyz`).then((r) => r.status === 200, () => false));
        },
        { timeout: 20_000, interval: 100 },
      );
      expect(fleet.process("mailer")!.pid).not.toBe(first.pid);

      const second = fleet.process("hooks")!;
      process.kill(second.pid!, "SIGKILL");
      await second.exited;
    } finally {
      await fleet.stop();
    }
    // The restart planned 1 s after the kill does not happen: the fleet is stopping.
    await new Promise((r) => setTimeout(r, 2000));
    expect(fleet.process("hooks")!.running()).toBe(false);
    expect(await isPortFree(ports.services.hooks)).toBe(true);
  });

  it("refuses to start when an entry point is missing", async () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), "fleet-empty-"));
    scratch.push(root);
    await expect(startFleet({ cwd: root, env: {}, ports: portsFromList(await freePorts(10)), output: "collect" })).rejects.toThrow(
      /missing process entry points: services\/identity\/src\/main.ts/,
    );
  });
});
