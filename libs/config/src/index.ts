/**
 * The one config loader. Every process describes the variables it reads as a spec, and
 * `loadConfig` validates them once at start. A bad or missing variable fails with one line
 * that names it, so an operator never has to read a stack trace to fix a deployment.
 */
import { isIP } from "node:net";

export const SERVICES = [
  "identity",
  "apps-builds",
  "deploy-queue",
  "domains-dns",
  "mailer",
  "storage",
  "hooks",
  "health-aggregator",
] as const;
export type ServiceName = (typeof SERVICES)[number];

/** Default RPC port of each service; the same numbers are used in compose and Kubernetes. */
export const SERVICE_PORTS: Record<ServiceName, number> = {
  identity: 7001,
  "apps-builds": 7002,
  "deploy-queue": 7003,
  "domains-dns": 7004,
  mailer: 7005,
  storage: 7006,
  hooks: 7007,
  "health-aggregator": 7008,
};
export const GATEWAY_PORT = 8080;
export const AGENT_HEALTH_PORT = 7100;

/** `IDENTITY_URL`, `APPS_BUILDS_URL`, ...: where a client finds a service. */
export function serviceUrlVar(name: ServiceName): string {
  return `${name.toUpperCase().replaceAll("-", "_")}_URL`;
}

/** Postgres schema owned by a service: `apps-builds` owns `apps_builds`. */
export function serviceSchema(name: ServiceName): string {
  return name.replaceAll("-", "_");
}

type VarType = "string" | "url" | "admin-url" | "postgres-url" | "nats-url" | "port" | "int" | "bool" | "enum" | "cidr-list" | "port-range";

export interface VarSpec {
  type: VarType;
  /** Used when the variable is unset or empty. A spec without a default is required. */
  default?: string;
  /** Unset is fine and reads as undefined. */
  optional?: boolean;
  values?: readonly string[];
  description: string;
}

export type EnvSpec = Record<string, VarSpec>;

type ValueOf<V extends VarSpec> = V["type"] extends "port" | "int"
  ? number
  : V["type"] extends "bool"
    ? boolean
    : string;

export type Config<S extends EnvSpec> = {
  readonly [K in keyof S]: S[K]["optional"] extends true
    ? S[K]["default"] extends string
      ? ValueOf<S[K]>
      : ValueOf<S[K]> | undefined
    : ValueOf<S[K]>;
};

export class ConfigError extends Error {
  readonly variable: string;
  constructor(variable: string, problem: string) {
    super(`Invalid environment variable ${variable}: ${problem}`);
    this.name = "ConfigError";
    this.variable = variable;
  }
}

function parseValue(name: string, spec: VarSpec, raw: string): string | number | boolean {
  const shown = raw.length > 60 ? `${raw.slice(0, 57)}...` : raw;
  switch (spec.type) {
    case "string":
      return raw;
    case "enum":
      if (!spec.values?.includes(raw)) {
        throw new ConfigError(name, `must be one of ${spec.values?.join(", ")} (got '${shown}')`);
      }
      return raw;
    case "bool":
      if (["true", "1", "yes"].includes(raw.toLowerCase())) return true;
      if (["false", "0", "no"].includes(raw.toLowerCase())) return false;
      throw new ConfigError(name, `must be true or false (got '${shown}')`);
    case "int":
    case "port": {
      const n = Number(raw);
      if (!/^\d+$/.test(raw) || !Number.isSafeInteger(n)) {
        throw new ConfigError(name, `must be a whole number (got '${shown}')`);
      }
      if (spec.type === "port" && n > 65535) {
        throw new ConfigError(name, `must be a port between 0 and 65535 (got '${shown}')`);
      }
      return n;
    }
    case "cidr-list":
      return parseCidrList(name, raw).join(",");
    case "port-range": {
      const match = /^\s*(\d{1,5})\s*-\s*(\d{1,5})\s*$/.exec(raw);
      const [first, last] = match ? [Number(match[1]), Number(match[2])] : [0, 0];
      if (!match || first < 1024 || last > 65535 || first > last) {
        throw new ConfigError(name, `must be a range of ports such as 20000-29999, from 1024 to 65535 (got '${shown}')`);
      }
      return `${first}-${last}`;
    }
    case "url":
    case "admin-url":
    case "postgres-url":
    case "nats-url": {
      let url: URL;
      try {
        url = new URL(raw);
      } catch {
        throw new ConfigError(name, `must be a URL (got '${shown}')`);
      }
      const schemes =
        spec.type === "postgres-url"
          ? ["postgres:", "postgresql:"]
          : spec.type === "nats-url"
            ? ["nats:", "tls:", "ws:", "wss:"]
            : spec.type === "admin-url"
              ? ["http:", "https:", "unix:"]
              : ["http:", "https:"];
      if (!schemes.includes(url.protocol)) {
        throw new ConfigError(name, `must use ${schemes.map((s) => `${s}//`).join(" or ")} (got '${shown}')`);
      }
      return raw;
    }
  }
}

/** `10.0.0.0/8, 192.0.2.7, fd00::/8`: each an IPv4 or IPv6 address with an optional prefix length. */
function parseCidrList(name: string, raw: string): string[] {
  return raw
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p !== "")
    .map((p) => {
      const [address = "", prefix, ...rest] = p.split("/");
      const family = isIP(address);
      const bits = family === 4 ? 32 : 128;
      if (family === 0 || rest.length > 0 || (prefix !== undefined && (!/^\d{1,3}$/.test(prefix) || Number(prefix) > bits))) {
        throw new ConfigError(name, `must be a comma-separated list of networks such as 10.0.0.0/8 or fd00::/8 (got '${p}')`);
      }
      return p;
    });
}

export function loadConfig<S extends EnvSpec>(spec: S, env: NodeJS.ProcessEnv = process.env): Config<S> {
  const out: Record<string, unknown> = {};
  for (const [name, varSpec] of Object.entries(spec)) {
    const raw = env[name];
    const value = raw === undefined || raw === "" ? varSpec.default : raw;
    if (value === undefined) {
      if (varSpec.optional) {
        out[name] = undefined;
        continue;
      }
      throw new ConfigError(name, `is required (${varSpec.description})`);
    }
    out[name] = parseValue(name, varSpec, value);
  }
  return Object.freeze(out) as Config<S>;
}

/**
 * Process entry helper: load the config or print the one line and exit non-zero.
 */
export function loadConfigOrExit<S extends EnvSpec>(spec: S, env: NodeJS.ProcessEnv = process.env): Config<S> {
  try {
    return loadConfig(spec, env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(1);
    }
    throw err;
  }
}

const common = {
  NATS_URL: { type: "nats-url", default: "nats://127.0.0.1:4222", description: "NATS server with JetStream" },
  PLATFORM_ENVIRONMENT: { type: "string", default: "dev", description: "name of this environment" },
  PLATFORM_DOMAIN: { type: "string", default: "localhost", description: "domain apps are served under" },
  PLATFORM_ROUTER_PORT: {
    type: "port",
    default: "8480",
    description: "HTTP port of the router (Caddy) serving every app's front door; 80 omits it from app URLs",
  },
  LOG_LEVEL: {
    type: "enum",
    default: "info",
    values: ["trace", "debug", "info", "warn", "error", "fatal", "silent"],
    description: "pino log level",
  },
  OTEL_EXPORTER_OTLP_ENDPOINT: { type: "url", optional: true, description: "OTLP/HTTP collector; traces are exported when set" },
  PLATFORM_INTERNAL_TOKEN: {
    type: "string",
    optional: true,
    description:
      "shared secret of the fleet's internal RPC: every call carries it and every service refuses a call without it; unset, an RPC port answers anything that reaches it",
  },
  BUS_PREFIX: {
    type: "string",
    default: "",
    optional: true,
    description: "prefix of every NATS subject and stream, isolating fleets that share one server (tests)",
  },
} as const satisfies EnvSpec;

const database = {
  DATABASE_URL: {
    type: "postgres-url",
    default: "postgres://postgres@127.0.0.1:5432/platform",
    description: "Postgres database holding every service's schema",
  },
} as const satisfies EnvSpec;

function rpcPort(name: ServiceName) {
  return {
    RPC_PORT: {
      type: "port",
      default: String(SERVICE_PORTS[name]),
      description: "port of the service's Connect RPC and health endpoints",
    },
    RPC_HOST: { type: "string", default: "127.0.0.1", description: "address the RPC server binds" },
  } as const satisfies EnvSpec;
}

function serviceUrl(name: ServiceName): EnvSpec {
  return {
    [serviceUrlVar(name)]: {
      type: "url",
      default: `http://127.0.0.1:${SERVICE_PORTS[name]}`,
      description: `base URL of the ${name} service`,
    },
  };
}

/** Every service shares this shape: its own port, Postgres, NATS. */
export function serviceEnv(name: ServiceName) {
  return { ...common, ...database, ...rpcPort(name) } as const;
}

export const identityEnv = {
  ...serviceEnv("identity"),
  // A group that still owns apps is not deleted: apps-builds is asked.
  ...(serviceUrl("apps-builds") as Record<"APPS_BUILDS_URL", VarSpec>),
  PLATFORM_ROOT_KEY: {
    type: "string",
    optional: true,
    description: "the environment's root API key (pf_k1_...), seeded on first start",
  },
} as const satisfies EnvSpec;

/** Local file:// repositories are for one-machine platforms and tests (ARCHITECTURE section 8). */
const fileRepos = {
  PLATFORM_ALLOW_FILE_REPOS: {
    type: "bool",
    optional: true,
    description: "accept file:// repositories (default: true in the dev environment, false elsewhere)",
  },
} as const satisfies EnvSpec;

/** Whether file:// repositories are accepted: explicit setting, else only in `dev`. */
export function allowFileRepos(config: { PLATFORM_ALLOW_FILE_REPOS?: boolean; PLATFORM_ENVIRONMENT: string }): boolean {
  return config.PLATFORM_ALLOW_FILE_REPOS ?? config.PLATFORM_ENVIRONMENT === "dev";
}

export const appsBuildsEnv = {
  ...serviceEnv("apps-builds"),
  ...fileRepos,
  // Registration takes the group lock, which identity (the owner of groups) keeps.
  ...(serviceUrl("identity") as Record<"IDENTITY_URL", VarSpec>),
} as const satisfies EnvSpec;

export const deployQueueEnv = {
  ...serviceEnv("deploy-queue"),
  ...(serviceUrl("apps-builds") as Record<"APPS_BUILDS_URL", VarSpec>),
  FLEET_FLOOR: {
    type: "int",
    default: "1",
    description: "live agents the fleet should have; with fewer, a service no live host reports is unknown (fleet_below_floor), not not_running",
  },
  ORPHANED_ACTION_AFTER_S: {
    type: "int",
    default: "180",
    description:
      "how long an in-progress action waits for its silent agent (no heartbeat for 60 s) without a progress report before it fails naming the host (a deploy past its swap commit is recorded completed); an agent back in time finishes it",
  },
} as const satisfies EnvSpec;

export const healthAggregatorEnv = {
  ...serviceEnv("health-aggregator"),
  LOG_RETENTION_DAYS: {
    type: "int",
    default: "30",
    description: "days a stored log line is kept; older lines are deleted every hour",
  },
} as const satisfies EnvSpec;

export const gatewayEnv = {
  ...common,
  PORT: { type: "port", default: String(GATEWAY_PORT), description: "HTTP port of the /api gateway" },
  HOST: { type: "string", default: "127.0.0.1", description: "address the gateway binds" },
  ...(serviceUrl("identity") as Record<"IDENTITY_URL", VarSpec>),
  ...(serviceUrl("apps-builds") as Record<"APPS_BUILDS_URL", VarSpec>),
  ...(serviceUrl("deploy-queue") as Record<"DEPLOY_QUEUE_URL", VarSpec>),
  ...(serviceUrl("health-aggregator") as Record<"HEALTH_AGGREGATOR_URL", VarSpec>),
  CREDENTIAL_CACHE_TTL_MS: {
    type: "int",
    default: "30000",
    description: "how long a verified credential is trusted without asking identity",
  },
  BODY_LIMIT_BYTES: { type: "int", default: "1048576", description: "largest accepted request body" },
} as const satisfies EnvSpec;

export const agentEnv = {
  ...common,
  AGENT_HOST_ID: { type: "string", default: "local", description: "identity of this host in the fleet" },
  AGENT_HEALTH_PORT: {
    type: "port",
    default: String(AGENT_HEALTH_PORT),
    description: "port of the agent's /healthz and /readyz",
  },
  AGENT_HEALTH_HOST: { type: "string", default: "127.0.0.1", description: "address the health server binds" },
  AGENT_WORK_DIR: {
    type: "string",
    default: ".data/agent",
    description: "directory of the agent's working files (temporary clones of preflight and builds)",
  },
  AGENT_IMAGE_DIR: {
    type: "string",
    default: ".data/agent/images",
    description: "the host's image store: one archive per built tag",
  },
  AGENT_BUILD_TIMEOUT_S: { type: "int", default: "900", description: "a build running longer than this fails" },
  AGENT_IMAGE_MAX_MB: {
    type: "int",
    default: "2048",
    description: "the most a build's output may add up to (each file's length, holes of sparse files included, .git left out); a larger one fails the build; 0 for no limit",
  },
  AGENT_BUILD_MEMORY_MB: {
    type: "int",
    default: "4096",
    description: "memory one build command may use (its processes together, swap included); past it the command is killed and the build fails (where the host has a writable memory cgroup)",
  },
  AGENT_PIDS_MAX: {
    type: "int",
    default: "1024",
    description:
      "processes and threads one replica, or one build command, may run at once (where the host has a writable pids cgroup); a fork past it fails, so a fork bomb stays in its own cgroup; 0 for no limit",
  },
  AGENT_TENANT_MEMORY_PERCENT: {
    type: "int",
    default: "75",
    description:
      "share of the host's memory all replicas and build commands may use together (where the host has a writable memory cgroup): however many replicas tenants run, the rest stays the platform's; 0 for no such limit",
  },
  AGENT_TENANT_PIDS_PERCENT: {
    type: "int",
    default: "50",
    description:
      "share of the processes and threads the kernel allows (the lower of kernel.pid_max and kernel.threads-max) all replicas and build commands may run together (where the host has a writable pids cgroup and AGENT_PIDS_MAX is not 0); 0 for no such limit",
  },
  AGENT_RUN_DIR: {
    type: "string",
    default: ".data/agent/run",
    description: "where deployed releases, replica output and the agent's record of what runs are kept",
  },
  AGENT_RUNTIME: { type: "enum", default: "process", values: ["process", "docker"], description: "runtime driver of deployed services" },
  AGENT_DOCKER_SOCKET: { type: "string", default: "/var/run/docker.sock", description: "Docker Engine API socket (runtime docker)" },
  AGENT_ROUTER_ADMIN_URL: {
    type: "admin-url",
    default: "http://127.0.0.1:2019",
    description: "admin API of this host's Caddy: http://host:port, or unix:///path/to/socket (what npm start and test fleets use: no process of the host but the agent reaches it)",
  },
  AGENT_REPLICA_PORTS: {
    type: "port-range",
    default: "20000-29999",
    description:
      "the ports replicas listen on, first-last: keep it outside the kernel's ephemeral range (net.ipv4.ip_local_port_range), whose ports the kernel hands out to any process, tenant code included; the agent warns when they overlap",
  },
  AGENT_TENANT_UID: {
    type: "int",
    default: "61000",
    description:
      "user and group id tenant code (build commands, replicas) runs as in the sandbox, and whose connections the tenant fence limits: none to the host's own addresses but the router's port; 0 runs it as the agent's own user, unfenced",
  },
  AGENT_TENANT_DENIED_NETS: {
    type: "cidr-list",
    optional: true,
    description:
      "networks tenant code may not connect to, besides the host's own addresses and the link-local range (cloud metadata): where the control plane (Postgres, NATS, the services) lives when it is on other hosts; the agent adds the NATS server and services it is configured with",
  },
  AGENT_HEALTH_CHECK_TIMEOUT_S: {
    type: "int",
    default: "60",
    description: "how long a new replica has to answer its health check before the deploy fails",
  },
  AGENT_LOG_LINES_PER_MINUTE: {
    type: "int",
    default: "6000",
    description:
      "lines of output one replica, or one build's commands, may ship to the log store a minute (a minute's worth at once, then evenly); past it the lines are dropped and a line in the same log says how many; a build's own log keeps its first and last output regardless; 0 for no limit",
  },
  PLATFORM_ALLOW_FILE_REPOS: {
    type: "bool",
    optional: true,
    description: "accept file:// repository URLs (a bare repository on the host); default true in the dev environment",
  },
  ...(serviceUrl("deploy-queue") as Record<"DEPLOY_QUEUE_URL", VarSpec>),
  ...(serviceUrl("apps-builds") as Record<"APPS_BUILDS_URL", VarSpec>),
} as const satisfies EnvSpec;

/** The variables each process of the fleet reads; deploy files are checked against this. */
export const FLEET_ENV: Record<ServiceName | "gateway" | "agent", EnvSpec> = {
  identity: identityEnv,
  "apps-builds": appsBuildsEnv,
  "deploy-queue": deployQueueEnv,
  "domains-dns": serviceEnv("domains-dns"),
  mailer: serviceEnv("mailer"),
  storage: serviceEnv("storage"),
  hooks: serviceEnv("hooks"),
  "health-aggregator": healthAggregatorEnv,
  gateway: gatewayEnv,
  agent: agentEnv,
};
