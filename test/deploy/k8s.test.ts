/**
 * deploy/k8s, rendered by `kubectl kustomize deploy/k8s` and checked against the code
 * (@platform/config): a workload per process with probes on the right paths and ports, resources,
 * only variables the process reads, secrets from a Secret, and a Service per service and for the
 * gateway on the port the other processes are told to use.
 *
 * kubectl must be installed (no cluster is needed). Set KUBECTL to use another binary.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { beforeAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { FLEET_ENV, SERVICES, type ServiceName } from "@platform/config";
import { PROCESSES, ROOT, envProblems, facts, type ProcessName } from "./fleet.ts";

const KUBECTL = process.env["KUBECTL"] ?? "kubectl";
const INSTALL_HINT =
  "kubectl is needed to render deploy/k8s (no cluster is needed): install it with " +
  "`apt-get update && apt-get install -y kubernetes-client` (Debian's package of kubectl), " +
  "or point KUBECTL at a kubectl binary";

interface Probe {
  httpGet?: { path?: string; port?: number | string };
}
interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: {
    secretKeyRef?: { name: string; key: string; optional?: boolean };
    configMapKeyRef?: { name: string; key: string };
    fieldRef?: { fieldPath: string };
  };
}
interface Container {
  name: string;
  image?: string;
  command?: string[];
  args?: string[];
  ports?: { name?: string; containerPort: number }[];
  env?: EnvVar[];
  envFrom?: { configMapRef?: { name: string }; secretRef?: { name: string } }[];
  livenessProbe?: Probe;
  readinessProbe?: Probe;
  startupProbe?: Probe;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: { privileged?: boolean; runAsUser?: number; runAsNonRoot?: boolean; allowPrivilegeEscalation?: boolean; capabilities?: { drop?: string[]; add?: string[] } };
}
interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  spec?: {
    /** A Service's label map, or a workload's { matchLabels }. */
    selector?: Record<string, unknown>;
    template?: { metadata?: { labels?: Record<string, string> }; spec?: { containers?: Container[]; securityContext?: { runAsNonRoot?: boolean; runAsUser?: number } } };
    ports?: { name?: string; port: number; targetPort?: number | string }[];
  };
  data?: Record<string, string>;
}

/** Well-formed stand-ins for values that come from a Secret or the downward API. */
const SECRET_SAMPLES: Record<string, string> = {
  DATABASE_URL: "postgres://platform:secret@postgres.example:5432/platform",
  PLATFORM_ROOT_KEY: "pf_k1_sample",
  PLATFORM_INTERNAL_TOKEN: "internal-sample",
};
const FIELD_SAMPLES: Record<string, string> = { "spec.nodeName": "node-1" };
/** Variables that must come from a Secret, never a literal or a ConfigMap. */
const SECRET_VARS = ["DATABASE_URL", "PLATFORM_ROOT_KEY", "PLATFORM_INTERNAL_TOKEN"];

let objects: K8sObject[] = [];

function kubectlMissing(): boolean {
  const probe = spawnSync(KUBECTL, ["version", "--client"], { encoding: "utf8" });
  return probe.error !== undefined && (probe.error as NodeJS.ErrnoException).code === "ENOENT";
}

beforeAll(() => {
  if (kubectlMissing()) throw new Error(`${KUBECTL} not found. ${INSTALL_HINT}`);
  const rendered = execFileSync(KUBECTL, ["kustomize", "deploy/k8s"], { cwd: ROOT, encoding: "utf8" });
  objects = parseAllDocuments(rendered)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
});

function find(kind: string, name: string): K8sObject | undefined {
  return objects.find((o) => o.kind === kind && o.metadata.name === name);
}

function workloadKind(name: ProcessName): string {
  return name === "agent" ? "DaemonSet" : "Deployment";
}

function workload(name: ProcessName): K8sObject {
  const w = find(workloadKind(name), name);
  if (!w) throw new Error(`deploy/k8s renders no ${workloadKind(name)} ${name}`);
  return w;
}

function container(name: ProcessName): Container {
  const c = workload(name).spec?.template?.spec?.containers?.find((x) => x.name === name);
  if (!c) throw new Error(`${workloadKind(name)} ${name} has no container named ${name}`);
  return c;
}

/** A probe's or a Service's port, by number or by the container port's name. */
function resolvePort(c: Container, port: number | string | undefined): number | undefined {
  if (typeof port === "number") return port;
  return c.ports?.find((p) => p.name === port)?.containerPort;
}

/** Whether `labels` carry every label of `selector` (a non-empty map of strings). */
function selects(selector: unknown, labels: Record<string, string> | undefined): boolean {
  if (typeof selector !== "object" || selector === null) return false;
  const entries = Object.entries(selector);
  return entries.length > 0 && entries.every(([k, v]) => typeof v === "string" && labels?.[k] === v);
}

/** The environment the container starts with, as the process sees it; throws on what cannot be resolved. */
function containerEnv(c: Container): Record<string, string> {
  const env: Record<string, string> = {};
  for (const from of c.envFrom ?? []) {
    if (from.secretRef) throw new Error(`${c.name}: envFrom secretRef hides which variables it sets; use secretKeyRef`);
    const name = from.configMapRef?.name ?? "";
    const cm = find("ConfigMap", name);
    if (!cm) throw new Error(`${c.name}: envFrom names ConfigMap ${name}, which deploy/k8s does not render`);
    Object.assign(env, cm.data ?? {});
  }
  for (const v of c.env ?? []) {
    if (v.value !== undefined) env[v.name] = v.value;
    else if (v.valueFrom?.secretKeyRef) env[v.name] = SECRET_SAMPLES[v.valueFrom.secretKeyRef.key] ?? "sample";
    else if (v.valueFrom?.fieldRef) env[v.name] = FIELD_SAMPLES[v.valueFrom.fieldRef.fieldPath] ?? "sample";
    else if (v.valueFrom?.configMapKeyRef) {
      const ref = v.valueFrom.configMapKeyRef;
      const value = find("ConfigMap", ref.name)?.data?.[ref.key];
      if (value === undefined) throw new Error(`${c.name}: ${v.name} names ConfigMap key ${ref.name}/${ref.key}, not rendered`);
      env[v.name] = value;
    } else throw new Error(`${c.name}: ${v.name} has neither a value nor a source this test knows`);
  }
  return env;
}

/** Whether `host:port` in the cluster reaches the pods of the service `target`. */
function k8sReaches(target: ServiceName, host: string, port: number): boolean {
  const svc = find("Service", host);
  if (!svc || host !== target) return false;
  const c = container(target);
  const p = svc.spec?.ports?.find((x) => x.port === port);
  return (
    p !== undefined &&
    resolvePort(c, p.targetPort ?? p.port) === facts(target).port &&
    selects(svc.spec?.selector, workload(target).spec?.template?.metadata?.labels)
  );
}

describe("deploy/k8s renders", () => {
  it("with kubectl kustomize", () => {
    expect(objects.length).toBeGreaterThan(0);
  });

  it("a workload per process of the code and no other", () => {
    const workloads = objects.filter((o) => ["Deployment", "DaemonSet", "StatefulSet"].includes(o.kind));
    expect(workloads.map((o) => `${o.kind}/${o.metadata.name}`).sort()).toEqual(
      PROCESSES.map((p) => `${workloadKind(p)}/${p}`).sort(),
    );
  });

  it("no ConfigMap holds a secret; secrets come from the Secret platform-secrets", () => {
    for (const cm of objects.filter((o) => o.kind === "ConfigMap")) {
      for (const variable of SECRET_VARS) expect(cm.data?.[variable], `${cm.metadata.name} ${variable}`).toBeUndefined();
    }
    for (const name of PROCESSES) {
      for (const v of container(name).env ?? []) {
        if (!SECRET_VARS.includes(v.name)) continue;
        expect(v.valueFrom?.secretKeyRef?.name, `${name} ${v.name}`).toBe("platform-secrets");
        expect(v.valueFrom?.secretKeyRef?.key, `${name} ${v.name}`).toBe(v.name);
      }
    }
    const identityKey = container("identity").env?.find((v) => v.name === "PLATFORM_ROOT_KEY");
    expect(identityKey?.valueFrom?.secretKeyRef, "identity reads PLATFORM_ROOT_KEY from the Secret").toBeDefined();
    expect(identityKey?.valueFrom?.secretKeyRef?.optional, "PLATFORM_ROOT_KEY is optional in the code").toBe(true);
  });
});

describe.each(PROCESSES)("deploy/k8s: %s against @platform/config", (name) => {
  const f = facts(name);

  it("runs the right image and entry", () => {
    const c = container(name);
    expect(c.image?.split(":")[0]).toBe(f.image);
    const argv = [...(c.command ?? []), ...(c.args ?? [])];
    expect(argv.slice(-f.command.length)).toEqual(f.command);
  });

  it("selects its own pods", () => {
    const w = workload(name);
    expect(selects(w.spec?.selector?.["matchLabels"], w.spec?.template?.metadata?.labels)).toBe(true);
  });

  it("has liveness and readiness probes on the code's paths and port", () => {
    const c = container(name);
    expect(c.ports?.map((p) => p.containerPort)).toContain(f.port);
    for (const [probe, path] of [
      ["livenessProbe", f.liveness],
      ["readinessProbe", f.readiness],
    ] as const) {
      const get = c[probe]?.httpGet;
      expect(get, `${probe}.httpGet`).toBeDefined();
      expect(get?.path, `${probe} path`).toBe(path);
      expect(resolvePort(c, get?.port), `${probe} port`).toBe(f.port);
    }
    if (c.startupProbe) {
      expect(c.startupProbe.httpGet?.path).toBe(f.liveness);
      expect(resolvePort(c, c.startupProbe.httpGet?.port)).toBe(f.port);
    }
  });

  it("has resource requests and limits", () => {
    const r = container(name).resources;
    for (const kind of ["requests", "limits"] as const) {
      expect(r?.[kind]?.["cpu"], `${kind}.cpu`).toBeDefined();
      expect(r?.[kind]?.["memory"], `${kind}.memory`).toBeDefined();
    }
  });

  it("sets only variables the process reads, every one it needs, with values its config loader accepts", () => {
    expect(envProblems(name, containerEnv(container(name)), { where: "k8s", reaches: k8sReaches })).toEqual([]);
  });

  it("sets its port and bind address", () => {
    const env = containerEnv(container(name));
    expect(env[f.portVar]).toBe(String(f.port));
    expect(env[f.hostVar]).toBe("0.0.0.0");
  });

  it("gets DATABASE_URL from the Secret exactly when it reads it", () => {
    const reads = "DATABASE_URL" in FLEET_ENV[name];
    const v = container(name).env?.find((e) => e.name === "DATABASE_URL");
    expect(v?.valueFrom?.secretKeyRef !== undefined, `${name} reads DATABASE_URL: ${reads}`).toBe(reads);
  });
});

describe.each([...SERVICES, "gateway" as const])("deploy/k8s: Service %s", (name) => {
  it("exposes the code's port and selects the process's pods", () => {
    const f = facts(name);
    const svc = find("Service", name);
    expect(svc, `Service ${name}`).toBeDefined();
    const c = container(name);
    const port = svc?.spec?.ports?.find((p) => p.port === f.port);
    expect(port, `Service ${name} port ${f.port}`).toBeDefined();
    expect(resolvePort(c, port?.targetPort ?? port?.port)).toBe(f.port);
    expect(selects(svc?.spec?.selector, workload(name).spec?.template?.metadata?.labels)).toBe(true);
  });
});

describe("deploy/k8s: the agent", () => {
  it("is named after its node (AGENT_HOST_ID from spec.nodeName)", () => {
    const v = container("agent").env?.find((e) => e.name === "AGENT_HOST_ID");
    expect(v?.valueFrom?.fieldRef?.fieldPath).toBe("spec.nodeName");
  });

  it("runs privileged, as root, to sandbox tenant code; its router and every other process do not", () => {
    expect(container("agent").securityContext).toMatchObject({ privileged: true, runAsUser: 0 });
    const pod = workload("agent").spec?.template?.spec;
    expect(pod?.securityContext?.runAsNonRoot).not.toBe(true);
    const router = pod?.containers?.find((c) => c.name === "router");
    expect(router?.securityContext).toMatchObject({ runAsNonRoot: true, allowPrivilegeEscalation: false, capabilities: { drop: ["ALL"] } });
    for (const name of PROCESSES.filter((p) => p !== "agent")) {
      expect(workload(name).spec?.template?.spec?.securityContext?.runAsNonRoot, name).toBe(true);
      expect(container(name).securityContext?.privileged, name).not.toBe(true);
    }
  });
});
