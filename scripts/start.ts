/**
 * `npm start`: the whole platform on this machine. Postgres, NATS and the router's Caddy are used
 * when they answer and started under .data/ when they do not; then the eight services, the
 * gateway and one agent start as child processes with their output prefixed by name. Whatever
 * this started and then dies is started again. Ctrl-C stops everything this started (the fleet,
 * then the Postgres/NATS/Caddy it started; never the machine's own).
 */
import path from "node:path";
import { GATEWAY_PORT, agentEnv, loadConfigOrExit } from "@platform/config";
import {
  DEFAULT_DATA_DIR,
  DEFAULT_DATABASE_URL,
  DEFAULT_NATS_URL,
  FleetStartError,
  adminSocketUrl,
  InfrastructureError,
  REPO_ROOT,
  defaultPorts,
  ensureInfrastructure,
  internalToken,
  loadOrCreateRootKey,
  rootKeyFile,
  startFleet,
  type Fleet,
  type StartedInfrastructure,
} from "@platform/fleet";

const env = { ...process.env };
env.DATABASE_URL ||= DEFAULT_DATABASE_URL;
env.NATS_URL ||= DEFAULT_NATS_URL;
// On a socket under .data, which the sandbox hides: no tenant code can rewrite the routes.
env.AGENT_ROUTER_ADMIN_URL ||= adminSocketUrl(path.join(DEFAULT_DATA_DIR, "caddy", "admin.sock"));
const port = Number(env.PORT || GATEWAY_PORT);
if (!Number.isInteger(port) || port < 1 || port > 65535) {
  process.stderr.write(`Invalid environment variable PORT: must be a port between 1 and 65535 (got '${env.PORT}')\n`);
  process.exit(1);
}
const router = loadConfigOrExit(
  { AGENT_ROUTER_ADMIN_URL: agentEnv.AGENT_ROUTER_ADMIN_URL, PLATFORM_ROUTER_PORT: agentEnv.PLATFORM_ROUTER_PORT },
  env,
);

const say = (line = "") => process.stdout.write(`${line}\n`);
const abort = new AbortController();
let infra: StartedInfrastructure | undefined;
let fleet: Fleet | undefined;
let starting: Promise<unknown> | undefined;
let stopping = false;

async function shutdown(code: number): Promise<never> {
  stopping = true;
  const began = Date.now();
  abort.abort();
  await starting?.catch(() => undefined);
  await fleet?.stop();
  if (infra && infra.started.length > 0) say(`stopping ${infra.started.join(", ")}`);
  await infra?.stop();
  if (fleet || infra?.started.length) say(`stopped (${((Date.now() - began) / 1000).toFixed(1)} s)`);
  process.exit(code);
}

/**
 * One Ctrl-C reaches this process twice: from the terminal (the whole foreground process group)
 * and again from npm, which forwards the signals it gets to its script. A second signal that
 * close is the same Ctrl-C, not the "again" that forces the stop.
 */
const SAME_SIGNAL_MS = 1000;
let firstSignalAt = 0;

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) {
      if (Date.now() - firstSignalAt < SAME_SIGNAL_MS) return;
      say("stopping now");
      process.exit(130);
    }
    firstSignalAt = Date.now();
    say(`\n${signal === "SIGINT" ? "Ctrl-C" : signal}: stopping (press Ctrl-C again to force)`);
    void shutdown(0);
  });
}

function fail(err: unknown): Promise<never> {
  if (!stopping) {
    const known = err instanceof InfrastructureError || err instanceof FleetStartError;
    process.stderr.write(`\nnpm start failed: ${known ? (err as Error).message : err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  }
  return shutdown(1);
}

async function main(): Promise<void> {
  starting = ensureInfrastructure({
    databaseUrl: env.DATABASE_URL!,
    natsUrl: env.NATS_URL!,
    router: { adminUrl: router.AGENT_ROUTER_ADMIN_URL, port: router.PLATFORM_ROUTER_PORT },
    dataDir: DEFAULT_DATA_DIR,
    log: (line) => say(`[infra] ${line}`),
    keepRunning: true,
  });
  infra = (await starting) as StartedInfrastructure;
  if (stopping) return;

  // Every process started below shares it: internal RPC refuses calls without it.
  env.PLATFORM_INTERNAL_TOKEN = internalToken(env);
  const rootKeyFromEnv = Boolean(env.PLATFORM_ROOT_KEY?.trim());
  const rootKey = loadOrCreateRootKey(DEFAULT_DATA_DIR, env);
  starting = startFleet({
    env,
    rootKey,
    ports: defaultPorts(port),
    output: "prefix",
    signal: abort.signal,
    restartOnExit: true,
  });
  fleet = (await starting) as Fleet;
  starting = undefined;

  const api = `${fleet.gatewayUrl}/api`;
  const keySource = rootKeyFromEnv ? "from PLATFORM_ROOT_KEY" : `stored in ${path.relative(REPO_ROOT, rootKeyFile(DEFAULT_DATA_DIR))}`;
  say();
  say("  The platform is running.");
  say();
  say(`    API        ${api}`);
  say(`    Docs       ${api}/docs`);
  say(`    Apps       http://127.0.0.1:${router.PLATFORM_ROUTER_PORT}   (Caddy; admin API ${router.AGENT_ROUTER_ADMIN_URL})`);
  say(`    Root key   ${rootKey}   (${keySource})`);
  say();
  say("  Try it:");
  say(`    curl -H "Authorization: Bearer ${rootKey}" ${api}/auth/me`);
  say();
  say("  Ctrl-C stops everything.");
  say();
}

main().catch(fail);
