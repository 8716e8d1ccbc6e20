/**
 * What the code says about each process of the fleet, and the checks that docker-compose.yml and
 * deploy/k8s share. The source of truth is @platform/config: FLEET_ENV (the variables each process
 * reads), SERVICE_PORTS, GATEWAY_PORT, AGENT_HEALTH_PORT and serviceUrlVar. The deploy files are
 * checked against it, never the other way round.
 */
import path from "node:path";
import { fileURLToPath } from "node:url";
import {
  AGENT_HEALTH_PORT,
  ConfigError,
  FLEET_ENV,
  GATEWAY_PORT,
  SERVICE_PORTS,
  SERVICES,
  loadConfig,
  serviceUrlVar,
  type ServiceName,
} from "@platform/config";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

export type ProcessName = keyof typeof FLEET_ENV;

export const PROCESSES: readonly ProcessName[] = [...SERVICES, "gateway", "agent"];

export function isService(name: string): name is ServiceName {
  return (SERVICES as readonly string[]).includes(name);
}

export interface ProcessFacts {
  name: ProcessName;
  /** The process entry, relative to the repository root (the image's WORKDIR). */
  entry: string;
  /** `node --import @platform/telemetry/register <entry>`. */
  command: string[];
  /** Image and Dockerfile target the process runs from. */
  image: "platform/runtime" | "platform/agent";
  target: "runtime" | "agent";
  /** The variable naming the port the process serves its health endpoints on, and that port. */
  portVar: string;
  port: number;
  /** The variable naming the address the process binds; 0.0.0.0 in a container. */
  hostVar: string;
  liveness: string;
  readiness: string;
}

export function facts(name: ProcessName): ProcessFacts {
  const node = (entry: string) => ["node", "--import", "@platform/telemetry/register", entry];
  if (isService(name)) {
    const entry = `services/${name}/src/main.ts`;
    return {
      name,
      entry,
      command: node(entry),
      image: "platform/runtime",
      target: "runtime",
      portVar: "RPC_PORT",
      port: SERVICE_PORTS[name],
      hostVar: "RPC_HOST",
      liveness: "/healthz",
      readiness: "/readyz",
    };
  }
  if (name === "gateway") {
    const entry = "gateway/src/main.ts";
    return {
      name,
      entry,
      command: node(entry),
      image: "platform/runtime",
      target: "runtime",
      portVar: "PORT",
      port: GATEWAY_PORT,
      hostVar: "HOST",
      liveness: "/api/health",
      readiness: "/api/health",
    };
  }
  const entry = "agent/src/main.ts";
  return {
    name,
    entry,
    command: node(entry),
    image: "platform/agent",
    target: "agent",
    portVar: "AGENT_HEALTH_PORT",
    port: AGENT_HEALTH_PORT,
    hostVar: "AGENT_HEALTH_HOST",
    liveness: "/healthz",
    readiness: "/readyz",
  };
}

/** Variables a process must be given: no default and not optional. */
export function requiredVars(name: ProcessName): string[] {
  return Object.entries(FLEET_ENV[name])
    .filter(([, spec]) => spec.default === undefined && !spec.optional)
    .map(([variable]) => variable);
}

/**
 * Variables whose default points at this machine's loopback (127.0.0.1): right for `npm start`,
 * wrong in a container, where Postgres, NATS and the other services are other hosts and a server
 * bound to loopback cannot be reached. A deploy file must set every one of them.
 */
export function loopbackDefaultVars(name: ProcessName): string[] {
  return Object.entries(FLEET_ENV[name])
    .filter(([, spec]) => spec.default?.includes("127.0.0.1") ?? false)
    .map(([variable]) => variable);
}

export interface EnvCheckOptions {
  /** Where the environment comes from, for the messages ("compose", "k8s"). */
  where: string;
  /** Whether `host` is a host name that reaches the service `service` on `port`. */
  reaches: (service: ServiceName, host: string, port: number) => boolean;
}

/**
 * Every problem with the environment a deploy file gives a process, one line each; empty when it
 * is right. Values are strings as the process would see them (interpolated for compose, secret
 * values replaced by well-formed samples for Kubernetes).
 */
export function envProblems(name: ProcessName, env: Record<string, string>, opts: EnvCheckOptions): string[] {
  const problems: string[] = [];
  const spec = FLEET_ENV[name];
  const f = facts(name);
  const say = (text: string) => problems.push(`${opts.where}: ${name}: ${text}`);

  for (const variable of Object.keys(env)) {
    if (!(variable in spec)) say(`sets ${variable}, which ${name} does not read (not in FLEET_ENV.${name})`);
  }
  for (const variable of requiredVars(name)) {
    if (!env[variable]) say(`does not set ${variable}, which ${name} requires`);
  }
  for (const variable of loopbackDefaultVars(name)) {
    if (!env[variable]) say(`does not set ${variable}; its default (${spec[variable]?.default}) is loopback`);
  }

  try {
    loadConfig(spec, env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    say(`the config loader rejects it: ${err.message}`);
  }

  if (env[f.portVar] !== undefined && env[f.portVar] !== String(f.port)) {
    say(`${f.portVar} is ${env[f.portVar]}, the code's port is ${f.port}`);
  }
  if (env[f.hostVar] !== undefined && env[f.hostVar] !== "0.0.0.0") {
    say(`${f.hostVar} is ${env[f.hostVar]}; a server in a container must bind 0.0.0.0`);
  }

  for (const service of SERVICES) {
    const variable = serviceUrlVar(service);
    const value = env[variable];
    if (value === undefined) continue;
    let url: URL;
    try {
      url = new URL(value);
    } catch {
      say(`${variable} is not a URL: ${value}`);
      continue;
    }
    const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    if (url.protocol !== "http:" || port !== SERVICE_PORTS[service] || !opts.reaches(service, url.hostname, port)) {
      say(`${variable} is ${value}; expected http://${service}:${SERVICE_PORTS[service]} (the ${service} service)`);
    }
  }
  return problems;
}
