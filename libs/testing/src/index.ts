/**
 * The test harness. End-to-end tests start a whole fleet as real processes on free ports with
 * `startTestFleet()`: its own database on the machine's Postgres, its own NATS subject and stream
 * prefix, its own root key and its own Caddy as the agent's router, so fleets of different test
 * files never see each other. Integration tests of one service use `createTestDatabase()` and
 * `uniquePrefix()` the same way.
 *
 * The machine's Postgres and NATS must answer (DATABASE_URL / NATS_URL, or the defaults);
 * `npm test` makes sure of that before running the tests. Caddy must be installed (Debian's
 * `caddy`); `startCaddy` installs it when it runs as root on a machine with apt-get.
 */
import os from "node:os";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import pg from "pg";
import { platformErrorOf } from "@platform/rpc";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import {
  adminSocketUrl,
  DEFAULT_DATABASE_URL,
  DEFAULT_NATS_URL,
  REPO_ROOT,
  freePorts,
  generateRootKey,
  internalToken,
  portsFromList,
  serviceUrls,
  startCaddy,
  startFleet,
  stopReplicas,
  type FleetProcess,
  type StartedCaddy,
} from "@platform/fleet";

export { freePort, freePorts, generateRootKey, startCaddy, type StartedCaddy } from "@platform/fleet";

/** Databases this harness creates are named `platform_test_<random>`; only those may be dropped. */
export const TEST_DATABASE_PREFIX = "platform_test_";

/** The Postgres server tests use: DATABASE_URL (its database name is ignored) or the default. */
export function testServerUrl(): string {
  return process.env.DATABASE_URL || DEFAULT_DATABASE_URL;
}

export function testNatsUrl(): string {
  return process.env.NATS_URL || DEFAULT_NATS_URL;
}

/** A short random token, e.g. `t3f9a0c1b2e`: usable as a BUS_PREFIX, stream-name part or schema suffix. */
export function uniquePrefix(base = "t"): string {
  return `${base}${randomBytes(5).toString("hex")}`;
}

function withDatabase(serverUrl: string, name: string): string {
  const url = new URL(serverUrl);
  url.pathname = `/${encodeURIComponent(name)}`;
  return url.toString();
}

function databaseName(url: string): string {
  return decodeURIComponent(new URL(url).pathname.slice(1));
}

async function withAdmin<T>(serverUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: withDatabase(serverUrl, "postgres"), connectionTimeoutMillis: 5000 });
  client.on("error", () => undefined);
  try {
    await client.connect();
  } catch (err) {
    throw new Error(
      `Postgres at ${new URL(serverUrl).host} does not answer (${err instanceof Error ? err.message : String(err)}). ` +
        "Run the tests with `npm test`, which starts Postgres and NATS when they are not running.",
      { cause: err },
    );
  }
  try {
    return await fn(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

export interface TestDatabaseOptions {
  /** The database name (default `platform_test_<random>`). */
  name?: string;
  /** The Postgres server (default `testServerUrl()`). */
  serverUrl?: string;
}

/** Creates a fresh, empty database and returns its URL. */
export async function createTestDatabase(opts: TestDatabaseOptions = {}): Promise<string> {
  const serverUrl = opts.serverUrl ?? testServerUrl();
  const name = opts.name ?? `${TEST_DATABASE_PREFIX}${randomBytes(5).toString("hex")}`;
  await withAdmin(serverUrl, async (client) => {
    for (let attempt = 1; ; attempt++) {
      try {
        await client.query(`create database ${pg.escapeIdentifier(name)}`);
        return;
      } catch (err) {
        // 55006: template1 is busy (another create database at the same moment); try again.
        if ((err as { code?: string }).code !== "55006" || attempt >= 10) throw err;
        await new Promise((resolve) => setTimeout(resolve, 100 * attempt));
      }
    }
  });
  return withDatabase(serverUrl, name);
}

/**
 * Drops a test database, disconnecting whoever is still connected (`with (force)`). Refuses a
 * database whose name does not start with `platform_test_` unless `anyName` is set.
 */
export async function dropDatabase(url: string, opts: { anyName?: boolean } = {}): Promise<void> {
  const name = databaseName(url);
  if (!name) throw new Error(`no database name in ${url}`);
  if (!opts.anyName && !name.startsWith(TEST_DATABASE_PREFIX)) {
    throw new Error(`refusing to drop ${name}: not a test database (${TEST_DATABASE_PREFIX}*)`);
  }
  await withAdmin(url, async (client) => {
    await client.query(`drop database if exists ${pg.escapeIdentifier(name)} with (force)`);
  });
}

/** Deletes every JetStream stream (KV and object-store buckets included) whose name contains `prefix`. */
export async function deleteBusStreams(prefix: string, natsUrl: string = testNatsUrl()): Promise<void> {
  if (prefix.length < 6) throw new Error(`refusing to delete streams by the short prefix '${prefix}'`);
  const nc = await connect({ servers: natsUrl, timeout: 5000, reconnect: false, name: "platform-test-cleanup" });
  try {
    const jsm = await jetstreamManager(nc);
    const doomed: string[] = [];
    for await (const name of jsm.streams.names()) if (name.includes(prefix)) doomed.push(name);
    for (const name of doomed) await jsm.streams.delete(name).catch(() => undefined);
  } finally {
    await nc.close().catch(() => undefined);
  }
}

export interface TestFleetOptions {
  /** Extra environment for every process, e.g. `{ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318" }`. */
  env?: Record<string, string | undefined>;
  /** Gateway processes sharing the rest of the fleet (default 1). */
  gatewayReplicas?: number;
  /** The root key to seed (default: a new one). */
  rootKey?: string;
  /** Start the agent (default true). */
  agent?: boolean;
  /** The NATS server the fleet uses (default the machine's, `NATS_URL` or 127.0.0.1:4222). */
  natsUrl?: string;
  /** How long one process may take to become ready (default 120 s). */
  readyTimeoutMs?: number;
  /**
   * Also write each process's output to `<logDir>/<name>.log`. Defaults to
   * `$TEST_FLEET_LOG_DIR/<busPrefix>` when that variable is set.
   */
  logDir?: string;
}

export interface TestFleet {
  /** Base URL of the first gateway's API, ending in `/api`. */
  api: string;
  /** Every gateway replica's API base URL. */
  apis: string[];
  /** The root key (admin scope, platform operator) for `Authorization: Bearer`. */
  rootKey: string;
  /** The environment the processes share (DATABASE_URL, NATS_URL, BUS_PREFIX, <SERVICE>_URL, ...). */
  env: Record<string, string>;
  databaseUrl: string;
  natsUrl: string;
  busPrefix: string;
  /**
   * The port apps are served on (PLATFORM_ROUTER_PORT of every process), by the fleet's own Caddy
   * that the agent drives. With `agent: false` no Caddy is started and nothing listens there.
   */
  routerPort: number;
  /** `http://127.0.0.1:<routerPort>`: send requests here with the app's host name in `Host`. */
  routerUrl: string;
  processes: FleetProcess[];
  /** The collected output of one process (`identity`, `gateway`, `gateway-2`, `agent`, ...). */
  logs(name: string): string;
  /** Kills one process (default SIGKILL) and starts it again; resolves once it is ready. */
  restart(name: string, signal?: NodeJS.Signals): Promise<void>;
  /** Stops every process, drops the database and deletes the fleet's streams. */
  stop(): Promise<void>;
}

/** Variables of the test runner that must not leak into the fleet's processes. */
function inheritedEnv(): Record<string, string | undefined> {
  const env: Record<string, string | undefined> = { ...process.env };
  for (const key of Object.keys(env)) {
    // HOST: the gateway of a test fleet listens on 127.0.0.1, where the harness looks for it.
    if (key.startsWith("VITEST") || ["NODE_OPTIONS", "TEST", "PLATFORM_ROOT_KEY", "PLATFORM_INTERNAL_TOKEN", "BUS_PREFIX", "HOST"].includes(key)) {
      delete env[key];
    }
  }
  return env;
}

export async function startTestFleet(options: TestFleetOptions = {}): Promise<TestFleet> {
  const replicas = options.gatewayReplicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1) throw new Error(`gatewayReplicas must be a whole number >= 1 (got ${replicas})`);
  const busPrefix = uniquePrefix("t");
  const natsUrl = options.natsUrl ?? testNatsUrl();
  const databaseUrl = await createTestDatabase({ name: `${TEST_DATABASE_PREFIX}${busPrefix.slice(1)}` });
  const rootKey = options.rootKey ?? generateRootKey();
  const processPorts = 8 + replicas + 1;
  const portList = await freePorts(processPorts + 1);
  const ports = portsFromList(portList, replicas);
  const routerPort = portList[processPorts]!;
  const withAgent = options.agent ?? true;
  const fleetDir = await mkdtemp(path.join(os.tmpdir(), `platform-fleet-${busPrefix}-`));
  const env: Record<string, string> = {};
  const shared: Record<string, string | undefined> = {
    ...inheritedEnv(),
    LOG_LEVEL: process.env.TEST_LOG_LEVEL || process.env.LOG_LEVEL || "info",
    DATABASE_URL: databaseUrl,
    NATS_URL: natsUrl,
    BUS_PREFIX: busPrefix,
    PLATFORM_INTERNAL_TOKEN: internalToken(options.env ?? {}),
    PLATFORM_ROUTER_PORT: String(routerPort),
    // A socket under the fleet's directory, as npm start has it: out of reach of tenant code.
    AGENT_ROUTER_ADMIN_URL: withAgent ? adminSocketUrl(path.join(fleetDir, "caddy", "admin.sock")) : undefined,
    // The agent's clones, images, releases and replicas belong to this fleet alone.
    AGENT_WORK_DIR: path.join(fleetDir, "agent"),
    AGENT_IMAGE_DIR: path.join(fleetDir, "agent", "images"),
    AGENT_RUN_DIR: path.join(fleetDir, "agent", "run"),
    ...options.env,
  };
  for (const [k, v] of Object.entries(shared)) if (v !== undefined) env[k] = v;
  const logDir = options.logDir ?? (process.env.TEST_FLEET_LOG_DIR ? path.resolve(REPO_ROOT, process.env.TEST_FLEET_LOG_DIR, busPrefix) : undefined);

  let caddy: StartedCaddy | undefined;
  const cleanup = async () => {
    await caddy?.stop();
    // Deployed apps outlive their agent by design; a test fleet takes them down with it.
    await stopReplicas(env.AGENT_RUN_DIR ?? path.join(fleetDir, "agent", "run"));
    await rm(fleetDir, { recursive: true, force: true });
    await dropDatabase(databaseUrl).catch(() => undefined);
    await deleteBusStreams(busPrefix, natsUrl).catch(() => undefined);
  };
  let fleet;
  try {
    if (withAgent) {
      caddy = await startCaddy({ adminSocket: path.join(fleetDir, "caddy", "admin.sock"), httpPort: routerPort, dataDir: path.join(fleetDir, "caddy"), log: () => undefined });
    }
    fleet = await startFleet({
      env,
      ports,
      rootKey,
      output: "collect",
      logDir,
      agent: options.agent,
      readyTimeoutMs: options.readyTimeoutMs,
    });
  } catch (err) {
    await cleanup();
    throw err;
  }
  const started = fleet;
  let stopped: Promise<void> | undefined;
  return {
    api: `${started.gatewayUrl}/api`,
    apis: started.gatewayUrls.map((u) => `${u}/api`),
    rootKey,
    env: { ...env, ...serviceUrls(ports) },
    databaseUrl,
    natsUrl,
    busPrefix,
    routerPort,
    routerUrl: `http://127.0.0.1:${routerPort}`,
    processes: started.processes,
    logs: (name) => started.logs(name),
    async restart(name, signal) {
      await started.restart(name, signal);
    },
    stop() {
      stopped ??= started.stop().then(cleanup);
      return stopped;
    },
  };
}

/**
 * What an RPC call was refused with: its status and `{detail}` as the gateway would answer them.
 * Fails the test when the call succeeds or fails with anything but a platform error.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function refusal(call: Promise<unknown>): Promise<{ status: number; detail: any }> {
  try {
    await call;
  } catch (err) {
    const e = platformErrorOf(err);
    if (e) return { status: e.status, detail: e.detail };
    throw err;
  }
  throw new Error("expected a refusal");
}
