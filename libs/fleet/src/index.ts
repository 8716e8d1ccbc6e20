/**
 * Running the platform on one machine: the infrastructure it needs (Postgres, NATS JetStream),
 * the root key, and the fleet of processes. `npm start`, `npm test` and the test harness
 * (`@platform/testing`) are built from these pieces.
 */
export {
  ensureInfrastructure,
  probePostgres,
  probeNats,
  aptInstall,
  stopPid,
  natsServerBin,
  InfrastructureError,
  type InfrastructureOptions,
  type StartedInfrastructure,
  type InfraPart,
  type InfraLog,
} from "./infrastructure.ts";
export {
  startFleet,
  defaultPorts,
  portsFromList,
  serviceUrls,
  formatLogLine,
  FleetStartError,
  type Fleet,
  type FleetPorts,
  type FleetProcess,
  type FleetOutput,
  type ProcessKind,
  type StartFleetOptions,
} from "./fleet.ts";
export { adminSocketUrl, caddyAdmin, startCaddy, probeCaddy, type StartCaddyOptions, type StartedCaddy } from "./caddy.ts";
export { freePort, freePorts, isPortFree } from "./ports.ts";
export { removeCgroup, stopReplicas } from "./replicas.ts";
export { loadOrCreateRootKey, generateRootKey, internalToken, rootKeyFile, ROOT_KEY_PATTERN } from "./root-key.ts";
export { REPO_ROOT, DEFAULT_DATA_DIR, DEFAULT_DATABASE_URL, DEFAULT_NATS_URL, redactUrl } from "./paths.ts";
