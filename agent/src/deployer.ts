/**
 * DEPLOY, RETRY, UNDEPLOY, SERVICE_ACTION and RECONCILE_ROUTING on the agent (deployments issue,
 * ARCHITECTURE section 5). A deploy is blue/green:
 *
 *   setup         resolve the release (config, variables, front doors), unpack the image (fetched
 *                 from the fleet's image store when another host built it)
 *   start         start every replica of the new colour beside the serving one, each on a free port
 *   health_check  each HTTP service answers its health path; a replica that dies here fails the
 *                 deploy with its last 30 lines of output (crash output)
 *   ready         checks passed
 *   swap_committed  written to the host state and confirmed by the queue (from then on cancel is
 *                 refused), then the route flips to the new colour in one router call: the point
 *                 of no return
 *   drain         the old colour is let go, given time to finish its requests, then stopped
 *
 * Cancel is honoured between phases before the swap: the new colour is stopped and removed, the
 * old one never stopped serving. Each step is written to the host state first, so an agent that
 * restarts mid-deploy finishes (swap committed) or cleans up (not committed) from that record.
 */
import { mkdir, rename, rm, stat } from "node:fs/promises";
import http from "node:http";
import path from "node:path";
import { checkAppConfig, normalizeAppConfig, problemsSummary, type NormalizedServiceConfig } from "@platform/app-config";
import { freePort } from "@platform/fleet";
import { cutMessage } from "@platform/logship";
import { appKey, routeOf, type DeployedApp, type DeployedService, type HostState, type InflightDeploy } from "./host-state.ts";
import type { Mutex } from "./mutex.ts";
import type { RouteSpec, Router, RoutingDrift } from "./router-types.ts";
import type { Colour, ReplicaSpec, RuntimeDriver } from "./runtime/types.ts";
import { describeExit, type Supervisor } from "./supervisor.ts";
import { errorText } from "./error-text.ts";
import { runQuietly } from "./quiet-command.ts";
import { pruneImages, pruneReleases } from "./retention.ts";

export const CRASH_TAIL_LINES = 30;
/** How often a starting replica's health path is asked. */
const HEALTH_POLL_MS = 100;
/** How long after a replica's start it is asked more often: most answer within a few tenths of a second. */
const HEALTH_FAST_POLL_MS = 10;
const HEALTH_FAST_WINDOW_MS = 2000;
/** How often a health check that goes on looks for a cancel. */
const CANCEL_LOOK_MS = 1000;
/**
 * How long the route flip is tried once the swap is committed, COMMIT_RETRY_MS apart (a router
 * restarting takes seconds to answer). Past the point of no return a deploy rolls forward, so a
 * router still silent then does not fail it: the host's routing table already names the new
 * colour, and the routing check gives the router that table as soon as it answers again.
 */
const COMMIT_DEADLINE_MS = 120_000;
const COMMIT_RETRY_MS = 1_000;
const CANCELLED_BEFORE_SWAP = "Cancelled before the swap.";
/**
 * How long a replica without a health check (a background worker) must stay up to pass. Long
 * enough for a worker that fails once it has tried its connections: a worker that exited at 1.5 s
 * passed a 0.5 s window, and the old release's healthy workers were stopped for a crash loop.
 */
const UNCHECKED_UPTIME_MS = 5_000;

/** The payload of a DEPLOY/RETRY/UNDEPLOY/SERVICE_ACTION/RECONCILE_ROUTING action. */
export interface DeployJob {
  action_id: string;
  action_type: string;
  deployment_id?: string;
  app_name: string;
  branch: string;
  group_slug: string;
  image_tag?: string | null;
  build_id?: string | null;
  services?: unknown[] | null;
  purge?: boolean;
  /** UNDEPLOY with purge: the tags of the branch's builds, whose images are deleted. */
  purge_tags?: string[];
  service_name?: string | null;
  action?: "restart" | "stop" | "start" | null;
}

/** What apps-builds says the release is (ResolveRelease). */
export interface ReleaseInfo {
  imageTag: string;
  config: Record<string, unknown>;
  env: Record<string, string>;
  hosts: string[];
}

export type LogLevel = "info" | "warning" | "error";

export interface DeployerDeps {
  hostId: string;
  runDir: string;
  imageDir: string;
  driver: RuntimeDriver;
  supervisor: Supervisor;
  router: Router;
  state: HostState;
  /**
   * Held while a front door changes together with the host state's record of it, and while the
   * routing table is checked for drift from that record: a check between the two writes would
   * take the one written first for drift and undo it. One per host, shared by every Deployer.
   */
  routingTableLock: Mutex;
  resolve(job: DeployJob): Promise<ReleaseInfo>;
  /** Downloads a tag's archive from the fleet's image store to `file` (this host did not build it). */
  fetchImage(app: string, tag: string, file: string): Promise<void>;
  /** Removes tags' archives from the fleet's image store (undeploy with purge). */
  deleteImages(app: string, tags: string[]): Promise<void>;
  healthTimeoutMs: number;
  /** A free port for a new replica, being closed to the outside (portsGuarded); freePort unless set. */
  replicaPort?(): Promise<number>;
  /** Resolves once the ports replicaPort handed out are closed to the outside: before a swap routes to them. */
  portsGuarded?(): Promise<void>;
  /** How long the old colour keeps its connections after the flip before it is stopped. */
  drainMs: number;
  /** Grace between SIGTERM and SIGKILL when a replica is stopped. */
  stopGraceMs: number;
  /** How long the route flip is tried past the swap commit (default COMMIT_DEADLINE_MS). */
  routeDeadlineMs?: number;
  log(line: { level: LogLevel; message: string; service_name?: string; phase: string }): void;
  /**
   * Reports a phase; true means cancel was requested (and the swap is not committed). With
   * `wait`, the answer is the queue's answer to this report, not to the reports before it.
   */
  phase(name: string, opts?: { wait?: boolean }): Promise<boolean>;
}

export interface DeployOutcome {
  status: "completed" | "failed" | "cancelled";
  error_message: string;
  result: Record<string, unknown>;
}

/** Deploys being settled (`abandon`), by action id: one host state, so one map per process. */
const settling = new Map<string, Promise<void>>();

class DeployFailure extends Error {
  readonly crashOutput: Record<string, string[]> | null;
  constructor(message: string, crashOutput: Record<string, string[]> | null = null) {
    super(message);
    this.crashOutput = crashOutput;
  }
}
class DeployCancelled extends Error {}

/**
 * A sandboxed replica may bind its PORT alone (landlock.ts): when its crash output says a listen
 * was refused (node's words), the deploy's error says why.
 */
export function bindRefused(crash: Record<string, string[]>): string {
  const refused = Object.values(crash).some((lines) => lines.some((l) => /\b(listen|bind) EACCES\b/.test(l)));
  return refused ? " A replica may listen only on its PORT; binding another port was refused." : "";
}

/** How long one GET of a health path may take. */
const HEALTH_PROBE_TIMEOUT_MS = 2_000;

/**
 * One GET of the health path: a 2xx or 3xx answer within 2 s passes. `seen` says what came back,
 * for the deploy's error when the check never passes.
 */
export function probeHealth(port: number, healthPath: string): Promise<{ ok: boolean; seen: string }> {
  return new Promise((resolve) => {
    const req = http.get({ host: "127.0.0.1", port, path: healthPath, timeout: HEALTH_PROBE_TIMEOUT_MS, agent: false }, (res) => {
      res.resume();
      const status = res.statusCode ?? 500;
      resolve({ ok: status < 400, seen: `answered ${status}` });
    });
    let timedOut = false;
    req.on("timeout", () => {
      timedOut = true;
      req.destroy();
    });
    req.on("error", (err: NodeJS.ErrnoException) => {
      if (timedOut) resolve({ ok: false, seen: `did not answer within ${HEALTH_PROBE_TIMEOUT_MS / 1000} s` });
      // The usual cause: the service listens on a port of its own rather than the one it is given.
      else if (err.code === "ECONNREFUSED") resolve({ ok: false, seen: "found nothing listening on the service's PORT" });
      else resolve({ ok: false, seen: `failed: ${err.code ?? err.message}` });
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const safe = (s: string) => s.replace(/[^A-Za-z0-9_-]/g, "_");

/** A promise's outcome, held so that nobody need await it (a rejection is then not unhandled). */
type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown };
const settle = <T>(p: Promise<T>): Promise<Outcome<T>> =>
  p.then(
    (value) => ({ ok: true, value }),
    (error: unknown) => ({ ok: false, error }),
  );
function unwrap<T>(o: Outcome<T>): T {
  if (o.ok) return o.value;
  throw o.error;
}

/** Where a host keeps the tree of a release: the image unpacked, or the build's own output. */
export function releaseDir(runDir: string, group: string, app: string, branch: string, tag: string): string {
  return path.join(runDir, "releases", safe(group), safe(app), safe(branch), safe(tag));
}

/**
 * The deployment is part of the id: a service carried over by a deploy that named others keeps its
 * colour and tag, which a later deploy of that tag in the same colour would otherwise reuse.
 */
export function replicaId(key: string, service: string, colour: Colour, index: number, tag: string, deploymentId: string): string {
  return safe(`${key}.${service}.${colour}.${index}.${tag}.${deploymentId.slice(0, 8)}`).slice(0, 200);
}

export class Deployer {
  readonly #d: DeployerDeps;

  constructor(deps: DeployerDeps) {
    this.#d = deps;
  }

  /** Unpacks the tag's image (once) into the host's releases, fetching the image first if this host lacks it. */
  async #release(job: DeployJob, tag: string, emit: (l: LogLevel, m: string) => void): Promise<string> {
    const dir = releaseDir(this.#d.runDir, job.group_slug, job.app_name, job.branch, tag);
    if (await stat(dir).catch(() => null)) return dir;
    const image = path.join(this.#d.imageDir, job.app_name, `${tag}.tar.gz`);
    if (!(await stat(image).catch(() => null))) {
      await this.#d.fetchImage(job.app_name, tag, image).catch((err: unknown) => {
        const reason = errorText(err);
        throw new DeployFailure(`The image ${job.app_name}:${tag} is not in this host's image store (${this.#d.hostId}), and fetching it failed: ${reason}`);
      });
      emit("info", `Fetched image ${job.app_name}:${tag} from the fleet's image store`);
    }
    const tmp = `${dir}.unpack-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { recursive: true });
    const tar = await runQuietly("tar", ["-xzf", image, "-C", tmp]);
    if (tar.code !== 0) throw new DeployFailure(`Unpacking the image ${job.app_name}:${tag} failed: ${tar.stderr.slice(0, 300)}`);
    await rename(tmp, dir);
    return dir;
  }

  /**
   * Once a deploy is live, the branch's older releases and the app's older images go from this
   * host (retention.ts); what any replica here runs stays. Failing to remove them never fails it.
   */
  async #pruneHost(job: DeployJob, releaseDir: string, emit: (l: LogLevel, m: string) => void): Promise<void> {
    const d = this.#d;
    const replicas = [...d.state.apps().flatMap((a) => Object.values(a.services).flatMap((s) => s.replicas)), ...d.state.allInflight().flatMap((f) => f.replicas)];
    const releases = new Set([...d.state.apps().map((a) => a.releaseDir), ...replicas.map((r) => r.releaseDir)].map((dir) => path.resolve(dir)));
    const tags = new Set([...d.state.apps().filter((a) => a.app === job.app_name).map((a) => a.tag), ...replicas.filter((r) => r.app === job.app_name).map((r) => r.tag)]);
    try {
      const removed = await pruneReleases(path.dirname(releaseDir), releases);
      if (removed.length > 0) emit("info", `Removed ${removed.length} older release(s) of the branch from this host (${removed.join(", ")})`);
      const images = await pruneImages(path.join(d.imageDir, job.app_name), tags);
      if (images.length > 0) emit("info", `Removed ${images.length} older image(s) of the app from this host (${images.join(", ")}); the fleet's image store keeps them 30 days`);
    } catch (err) {
      emit("warning", `Older releases and images could not be removed from this host (${errorText(err)})`);
    }
  }

  async #stopReplicas(replicas: ReplicaSpec[]): Promise<void> {
    for (const r of replicas) this.#d.supervisor.release(r.id);
    await Promise.all(
      replicas.map(async (r) => {
        await this.#d.driver.stop(r.id, this.#d.stopGraceMs).catch(() => undefined);
        await this.#d.driver.remove(r.id).catch(() => undefined);
      }),
    );
  }

  #running(id: string): boolean {
    return this.#d.driver.list().some((s) => s.spec.id === id && s.running);
  }

  async #crashOutput(replicas: ReplicaSpec[]): Promise<Record<string, string[]>> {
    const out: Record<string, string[]> = {};
    for (const r of replicas) {
      if (this.#running(r.id) || out[r.service]) continue;
      // Each line as a log line keeps it: the crash output is shown again in the deploy's phases and on the app.
      out[r.service] = (await this.#d.driver.tail(r.id, CRASH_TAIL_LINES).catch(() => [])).slice(-CRASH_TAIL_LINES).map(cutMessage);
    }
    return out;
  }

  /** DEPLOY and RETRY. */
  async deploy(job: DeployJob): Promise<DeployOutcome> {
    const d = this.#d;
    // An earlier deploy of this branch left in flight (its route flip gave up past the swap
    // commit) is settled first: the queue runs one deploy of a branch at a time, so it is over,
    // and the new colour must not meet its replicas.
    for (const stale of d.state.allInflight()) {
      if (stale.actionId !== job.action_id && stale.next.app === job.app_name && stale.next.branch === job.branch) await this.abandon(stale.actionId);
    }
    // Found by app and branch: a group renamed since the last deploy keeps the app's key.
    const previous = d.state.appOf(job.app_name, job.branch);
    const key = previous?.key ?? appKey(job.group_slug, job.app_name, job.branch);
    const phases: Record<string, string[]> = {};
    let current = "setup";
    const emit = (level: LogLevel, message: string, service?: string) => {
      d.log({ level, message, service_name: service, phase: current });
      (phases[current] ??= []).push(service ? `[${service}] ${message}` : message);
    };
    const enter = async (name: string) => {
      current = name;
      phases[name] ??= [];
      // The output so far is recorded with the deploy in flight, for a restarted agent to show.
      if (inflight) await d.state.setInflight(inflight);
      if (await d.phase(name)) throw new DeployCancelled(`Cancelled before ${name}.`);
    };
    const result: Record<string, unknown> = { previous_tag: previous?.tag ?? null, runtime: d.driver.name, host: d.hostId };
    const finish = (status: DeployOutcome["status"], error: string): DeployOutcome => {
      result.phases = Object.fromEntries(Object.entries(phases).map(([k, v]) => [k, v.join("\n")]));
      return { status, error_message: error, result };
    };

    let inflight: InflightDeploy | null = null;
    const pending = d.state.inflight(job.action_id);
    if (pending) {
      // What the stopped agent had done stays in the deploy's phases; how it ended is the resume's.
      Object.assign(phases, structuredClone(pending.phases ?? {}));
      result.previous_tag = pending.previous?.tag ?? null;
      if (pending.env) result.env_vars_snapshot = pending.env;
      current = "resume";
      return this.#resume(pending, emit, finish, { confirm: () => d.phase("swap_committed", { wait: true }) });
    }

    try {
      await enter("setup");
      // The tag's tree is made ready (fetched, unpacked) while its release is resolved.
      const early = job.image_tag ? settle(this.#release(job, job.image_tag, emit)) : null;
      const hostsReadAt = Date.now();
      const release = await d.resolve(job);
      const tag = release.imageTag || job.image_tag || "";
      result.env_vars_snapshot = release.env;
      const checked = checkAppConfig(release.config);
      if (!checked.ok) throw new DeployFailure(`The app config is invalid, ${problemsSummary(checked.errors)}`);
      const config = normalizeAppConfig(checked.config);
      if (config.type !== "container") throw new DeployFailure("A static app is served from the edge, which this host does not run; only container apps deploy here.");
      const wanted = Array.isArray(job.services) && job.services.length > 0 ? new Set(job.services.map(String)) : null;
      const services = Object.entries(config.services).filter(([name]) => !wanted || wanted.has(name));
      if (services.length === 0) throw new DeployFailure("The config declares no service to run.");
      // A deploy that names some services leaves the others the release still declares running as
      // they are (their replicas, their release): only the named ones change colour.
      const carried = wanted && previous ? Object.entries(previous.services).filter(([name]) => !wanted.has(name) && name in config.services) : [];
      emit(
        "info",
        `Deploying ${job.app_name}:${tag} (${services.length} service(s)) on ${d.hostId}` +
          (carried.length > 0 ? `; ${carried.map(([n]) => n).join(", ")} keep${carried.length === 1 ? "s" : ""} running ${previous!.tag}` : ""),
      );
      const releaseDir = early && tag === job.image_tag ? unwrap(await early) : await this.#release(job, tag, emit);

      await enter("start");
      const colour: Colour = previous?.colour === "blue" ? "green" : "blue";
      const next: DeployedApp = {
        key,
        group: job.group_slug,
        app: job.app_name,
        branch: job.branch,
        tag,
        colour,
        deploymentId: job.deployment_id ?? job.action_id,
        hosts: release.hosts,
        hostsReadAt,
        releaseDir,
        services: {},
        since: new Date().toISOString(),
      };
      inflight = { actionId: job.action_id, key, colour, replicas: [], swapCommitted: false, next, previous, phases, env: release.env };
      for (const [name, service] of services) {
        const replicas: ReplicaSpec[] = [];
        for (let i = 0; i < service.replicas; i++) {
          const port = service.background ? null : await (this.#d.replicaPort ?? freePort)();
          replicas.push(this.#spec(job, next, name, service, i, port, release.env));
        }
        next.services[name] = { mount: service.background ? null : (service.mount ?? null), health: service.health ?? null, background: service.background, stopped: false, replicas };
        inflight.replicas.push(...replicas);
      }
      for (const [name, service] of carried) next.services[name] = service;
      // Recorded before anything starts, so a restarted agent knows what to clean up.
      await d.state.setInflight(inflight);
      for (const r of inflight.replicas) {
        await d.driver.start(r);
        emit("info", `Started replica ${r.index + 1} (${colour})${r.port ? ` on port ${r.port}` : ""}`, r.service);
      }

      await enter("health_check");
      await this.#healthCheck(next, inflight.replicas, emit, () => d.phase("health_check"));

      await enter("ready");
      emit("info", "Every service passed its checks");
      await d.portsGuarded?.();

      // The swap commit is written to the host state, then confirmed by the queue before the route
      // moves: from the confirmation on, cancel is refused. An agent that stops in between finds
      // the commit on restart and asks the queue again (#resume); a cancel that came first wins.
      inflight.swapCommitted = true;
      await d.state.setInflight(inflight);
      let cancelled = true;
      try {
        cancelled = await d.phase("swap_committed", { wait: true });
      } finally {
        // Not confirmed (cancelled, or the queue did not answer): the new colour is cleaned up below.
        if (cancelled) inflight.swapCommitted = false;
      }
      if (cancelled) throw new DeployCancelled(CANCELLED_BEFORE_SWAP);
      current = "swap_committed";
      const unrouted = await this.#commit(inflight, previous, emit);
      if (unrouted) result.deploy_warnings = [unrouted];
      current = "drain";
      await d.phase("drain");
      await this.#drain(previous, next, emit);
      await d.state.clearInflight(job.action_id);
      await this.#pruneHost(job, releaseDir, emit);
      result.services = Object.fromEntries(Object.entries(next.services).map(([n, s]) => [n, { replicas: s.replicas.length, ports: s.replicas.map((r) => r.port) }]));
      // The routing shape now live: the app's URLs are rebuilt from it, not from a config not yet deployed.
      result.mounts = Object.fromEntries(Object.entries(next.services).map(([n, s]) => [n, s.mount]));
      result.instance_status = { [d.hostId]: "running" };
      emit("info", `${job.app_name}:${tag} is live (${colour})`);
      return finish("completed", "");
    } catch (err) {
      if (inflight && !inflight.swapCommitted) {
        await this.#stopReplicas(inflight.replicas);
        await d.state.clearInflight(job.action_id);
      }
      if (err instanceof DeployCancelled) {
        emit("warning", `${err.message} The new colour was stopped; ${previous ? `${previous.tag} keeps serving` : "nothing was serving"}.`);
        return finish("cancelled", err.message);
      }
      const message = err instanceof DeployFailure ? err.message : `The agent failed: ${errorText(err)}`;
      if (err instanceof DeployFailure && err.crashOutput) result.crash_output = err.crashOutput;
      emit("error", message);
      if (previous) emit("info", `${previous.tag} keeps serving`);
      return finish("failed", message);
    }
  }

  #spec(job: DeployJob, app: DeployedApp, service: string, config: NormalizedServiceConfig, index: number, port: number | null, env: Record<string, string>): ReplicaSpec {
    return {
      id: replicaId(app.key, service, app.colour, index, app.tag, app.deploymentId),
      group: job.group_slug,
      app: job.app_name,
      branch: job.branch,
      service,
      colour: app.colour,
      index,
      tag: app.tag,
      deploymentId: app.deploymentId,
      releaseDir: app.releaseDir,
      command: config.run ?? "",
      env: {
        ...env,
        ...(port !== null ? { PORT: String(port) } : {}),
        PLATFORM_APP: job.app_name,
        PLATFORM_BRANCH: job.branch,
        PLATFORM_SERVICE: service,
        PLATFORM_RELEASE: app.tag,
      },
      port,
      memoryMb: config.memory_mb ?? null,
    };
  }

  /**
   * Waits until every replica passes its check. The health check can take its whole timeout, so a
   * cancel asked for meanwhile is looked for every CANCEL_LOOK_MS (the phase reported again: the
   * queue's answer says whether a cancel is pending), not only when the next phase begins.
   */
  async #healthCheck(app: DeployedApp, replicas: ReplicaSpec[], emit: (l: LogLevel, m: string, s?: string) => void, cancelRequested: () => Promise<boolean>): Promise<void> {
    const started = Date.now();
    const deadline = started + this.#d.healthTimeoutMs;
    const waiting = new Set(replicas.map((r) => r.id));
    /** The last answer to each waiting replica's health GET. */
    const seen = new Map<string, string>();
    let lookedAt = started;
    for (;;) {
      if (Date.now() - lookedAt >= CANCEL_LOOK_MS) {
        lookedAt = Date.now();
        if (await cancelRequested()) throw new DeployCancelled("Cancelled during health_check.");
      }
      const dead = replicas.filter((r) => !this.#running(r.id));
      if (dead.length > 0) {
        const crash = await this.#crashOutput(dead);
        for (const [service, lines] of Object.entries(crash)) for (const line of lines) emit("error", line, service);
        // How each service's first dead replica ended: an OOM kill or an exit code says what to fix.
        const states = new Map(this.#d.driver.list().map((s) => [s.spec.id, s]));
        const ends = new Map<string, string>();
        for (const r of dead) {
          if (ends.has(r.service)) continue;
          const exit = states.get(r.id)?.exit ?? null;
          ends.set(r.service, `${describeExit(exit)}${exit?.oomKilled && r.memoryMb ? ` (memory_mb ${r.memoryMb})` : ""}`);
        }
        const what = [...ends].map(([service, end]) => `service ${service} ${end}`).join("; ");
        throw new DeployFailure(`${what.charAt(0).toUpperCase()}${what.slice(1)} during the health checks.${bindRefused(crash)}`, crash);
      }
      for (const r of replicas) {
        if (!waiting.has(r.id)) continue;
        const svc = app.services[r.service]!;
        if (r.port === null || !svc.health) {
          waiting.delete(r.id);
          continue;
        }
        const probe = await probeHealth(r.port, svc.health);
        seen.set(r.id, probe.seen);
        if (probe.ok) {
          waiting.delete(r.id);
          emit("info", `Replica ${r.index + 1} answers ${svc.health}`, r.service);
        }
      }
      if (waiting.size === 0) {
        // A replica without a health check passes by staying up UNCHECKED_UPTIME_MS from its start
        // (deaths meanwhile are caught at the top of the loop); one that answered its health path
        // has shown it is up.
        const unchecked = replicas.some((r) => r.port === null || !app.services[r.service]!.health);
        if (!unchecked || Date.now() - started >= UNCHECKED_UPTIME_MS) return;
        await sleep(HEALTH_POLL_MS);
        continue;
      }
      if (Date.now() >= deadline) {
        // Each failing service once, by the last answer of its first replica still waiting.
        const last = new Map<string, string>();
        for (const r of replicas) if (waiting.has(r.id) && !last.has(r.service)) last.set(r.service, `GET ${app.services[r.service]!.health} ${seen.get(r.id) ?? "was not sent"}`);
        const within = `within ${Math.round(this.#d.healthTimeoutMs / 1000)} s`;
        const [only, answer] = [...last][0]!;
        throw new DeployFailure(
          last.size === 1
            ? `Service ${only} did not pass its health check ${within}: the last ${answer}.`
            : `Services ${[...last.keys()].join(", ")} did not pass their health checks ${within}: ${[...last].map(([service, a]) => `${service}'s last ${a}`).join("; ")}.`,
        );
      }
      await sleep(Date.now() - started < HEALTH_FAST_WINDOW_MS ? HEALTH_FAST_POLL_MS : HEALTH_POLL_MS);
    }
  }

  /**
   * The flip: the host state names the new colour, then the route moves to it in one router call. Returns null, or the
   * deploy warning of a router that never answered (the deploy still rolls forward).
   */
  async #commit(inflight: InflightDeploy, previous: DeployedApp | undefined, emit: (l: LogLevel, m: string, s?: string) => void): Promise<string | null> {
    const next = inflight.next;
    for (const r of inflight.replicas) this.#d.supervisor.desire(r);
    // Past the point of no return the deploy rolls forward: a router that does not answer (or
    // lost its table) is asked again, with the whole table if need be. The host state names the
    // new colour first, so the whole table has the flip in it; an agent that stops before the
    // router call finds the swap committed and makes it again (#resume).
    const deadline = Date.now() + (this.#d.routeDeadlineMs ?? COMMIT_DEADLINE_MS);
    const since = new Date().toISOString();
    let unrouted: string | null = null;
    for (;;) {
      let written = false;
      try {
        await this.#d.routingTableLock.run(async () => {
          await this.#frontDoorsAfterFlip(inflight, emit);
          await this.#d.state.setApp({ ...next, since });
          written = true;
          if (next.hosts.length > 0) await this.#d.router.put(routeOf(next));
          else await this.#d.router.remove(next.key);
        });
        break;
      } catch (err) {
        if (Date.now() >= deadline) {
          // Not even the host state was written: nothing names the new colour yet.
          if (!written) throw err;
          unrouted =
            `The router did not answer for ${Math.round((this.#d.routeDeadlineMs ?? COMMIT_DEADLINE_MS) / 1000)} s after the swap commit (${errorText(err)}). ` +
            `The deploy rolled forward: this host's routing table names ${next.tag} (${next.colour}), which the router is given as soon as it answers again.`;
          emit("warning", unrouted);
          break;
        }
        emit("warning", `The route did not switch (${errorText(err)}); trying again`);
        await sleep(COMMIT_RETRY_MS);
        await this.reassertRoutes().catch(() => undefined);
      }
    }
    if (!unrouted) emit("info", next.hosts.length > 0 ? `Route ${next.hosts.join(", ")} switched to ${next.colour}` : "Private app: no public route");
    if (previous) emit("info", `${previous.tag} (${previous.colour}) no longer receives new requests`);
    return unrouted;
  }

  /**
   * A route reconcile (a visibility flip) runs beside a deploy of its branch: when one came after
   * the deploy read its front doors, they are read again before the route moves, or the swap
   * would undo the flip. Not read, the route keeps what the deploy read, and says so.
   */
  async #frontDoorsAfterFlip(inflight: InflightDeploy, emit: (l: LogLevel, m: string, s?: string) => void): Promise<void> {
    const next = inflight.next;
    if (!this.#d.state.frontDoorsChangedSince(next.app, next.branch, next.hostsReadAt ?? 0)) return;
    const readAt = Date.now();
    try {
      const release = await this.#d.resolve({ action_id: inflight.actionId, action_type: "DEPLOY", app_name: next.app, branch: next.branch, group_slug: next.group, image_tag: next.tag });
      next.hosts = release.hosts;
      next.hostsReadAt = readAt;
    } catch (err) {
      emit("warning", `The app's visibility changed during the deploy and could not be read again (${errorText(err)}); reconcile the app once it is live.`);
    }
  }

  /** The replicas of the colour that served before are let go, save those the new release carried over. */
  async #drain(previous: DeployedApp | undefined, next: DeployedApp, emit: (l: LogLevel, m: string, s?: string) => void): Promise<void> {
    if (!previous) return;
    const kept = new Set(Object.values(next.services).flatMap((s) => s.replicas.map((r) => r.id)));
    const old = Object.values(previous.services).flatMap((s) => s.replicas).filter((r) => !kept.has(r.id));
    if (old.length === 0) return;
    for (const r of old) this.#d.supervisor.release(r.id);
    await sleep(this.#d.drainMs);
    await this.#stopReplicas(old);
    emit("info", `Stopped ${old.length} replica(s) of ${previous.tag}`);
  }

  /**
   * A deploy this host had in flight that the queue ended while the agent was away: settled as a
   * resumed one would be (a committed swap is finished, anything short of it cleaned up), with no
   * outcome to report.
   */
  async abandon(actionId: string): Promise<void> {
    // Settled once: the agent's start and the branch's next deploy may both come to it.
    const running = settling.get(actionId);
    if (running) return running;
    const pending = this.#d.state.inflight(actionId);
    if (!pending) return;
    const emit = (level: LogLevel, message: string) => this.#d.log({ level, message, phase: "abandon" });
    const settled = this.#resume(pending, emit, (status, error_message) => ({ status, error_message, result: {} }), { what: `Deploy ${actionId} was left unfinished` })
      .then(() => undefined)
      .finally(() => settling.delete(actionId));
    settling.set(actionId, settled);
    return settled;
  }

  /**
   * An action claimed again after an agent restart: finish a committed swap, else clean up. With
   * `confirm`, the queue is asked first whether the swap commit stands: the agent may have stopped
   * after writing it and before the queue heard of it, and a cancel the queue took meanwhile wins.
   * Without it (the queue ended the action), a commit written is finished: the route may have moved.
   */
  async #resume(
    pending: InflightDeploy,
    emit: (l: LogLevel, m: string, s?: string) => void,
    finish: (s: DeployOutcome["status"], e: string) => DeployOutcome,
    opts: { what?: string; confirm?: () => Promise<boolean> },
  ): Promise<DeployOutcome> {
    const d = this.#d;
    const what = opts.what ?? "The agent restarted during the deploy";
    const cancelled = pending.swapCommitted && opts.confirm ? await opts.confirm() : false;
    if (pending.swapCommitted && !cancelled) {
      // The colour that served before: recorded with the deploy, since the host state may
      // already name the new one (the agent stopped while draining).
      const previous = pending.previous ?? d.state.app(pending.key);
      const prior = previous && previous.colour !== pending.next.colour ? previous : undefined;
      await this.#commit(pending, prior, emit);
      await this.#drain(prior, pending.next, emit);
      await d.state.clearInflight(pending.actionId);
      emit("info", `${what}, after the swap commit: the deploy was finished`);
      return finish("completed", "");
    }
    await this.#stopReplicas(pending.replicas);
    await d.state.clearInflight(pending.actionId);
    const serving = d.state.app(pending.key);
    const kept = serving && serving.colour !== pending.next.colour ? `${serving.tag} kept serving` : "nothing was serving";
    if (cancelled) {
      emit("warning", `${what}, and the deploy was cancelled before the swap: the new colour was stopped; ${kept}.`);
      return finish("cancelled", CANCELLED_BEFORE_SWAP);
    }
    const message = `${what}, before the swap: the new colour was stopped; ${kept}.`;
    emit("error", message);
    return finish("failed", message);
  }

  /** UNDEPLOY: the route goes, then every replica; `purge` also deletes the branch's images and releases. */
  async undeploy(job: DeployJob): Promise<DeployOutcome> {
    const d = this.#d;
    const app = d.state.appOf(job.app_name, job.branch);
    const key = app?.key ?? appKey(job.group_slug, job.app_name, job.branch);
    const lines: string[] = [];
    const emit = (level: LogLevel, message: string) => {
      d.log({ level, message, phase: "undeploy" });
      lines.push(message);
    };
    // The record keeps the app, unrouted, until its replicas are stopped: an agent that stops
    // meanwhile still knows them, and a drift check does not route to them again. A router that
    // does not answer does not hold the undeploy back: the record no longer routes the branch, so
    // the routing check removes its front door once the router answers again.
    await d.routingTableLock.run(async () => {
      if (app) await d.state.setApp({ ...app, hosts: [] });
      await d.router.remove(key).catch((err: unknown) => {
        emit("warning", `The router did not remove the front door (${errorText(err)}); it is removed when the router answers again`);
      });
    });
    if (app) {
      const replicas = Object.values(app.services).flatMap((s) => s.replicas);
      await this.#stopReplicas(replicas);
      await d.state.removeApp(key);
      emit("info", `Stopped ${replicas.length} replica(s) of ${app.tag}; ${app.hosts.join(", ") || "the app"} is no longer routed`);
    } else {
      emit("info", "Nothing of this branch runs on this host");
    }
    if (job.purge) {
      // Releases live under the group the branch was deployed in, which a rename may have changed since.
      for (const group of new Set([job.group_slug, app?.group ?? job.group_slug])) {
        await rm(path.join(d.runDir, "releases", safe(group), safe(job.app_name), safe(job.branch)), { recursive: true, force: true });
      }
      const tags = job.purge_tags ?? [];
      for (const tag of tags) await rm(path.join(d.imageDir, job.app_name, `${tag}.tar.gz`), { force: true });
      await d.deleteImages(job.app_name, tags);
      emit("info", `Deleted ${tags.length} image(s) of the branch, here and in the fleet's image store, and its releases`);
    }
    return { status: "completed", error_message: "", result: { previous_tag: app?.tag ?? null, purge: job.purge === true, phases: { undeploy: lines.join("\n") } } };
  }

  /** SERVICE_ACTION: stop, start or restart one service's replicas (same ports, same release). */
  async serviceAction(job: DeployJob): Promise<DeployOutcome> {
    const d = this.#d;
    const app = d.state.appOf(job.app_name, job.branch);
    const name = job.service_name ?? "";
    const service: DeployedService | undefined = app?.services[name];
    if (!app || !service) {
      return { status: "failed", error_message: `Service '${name}' of ${job.app_name} (branch ${job.branch}) does not run on this host.`, result: {} };
    }
    const lines: string[] = [];
    const emit = (level: LogLevel, message: string) => {
      d.log({ level, message, service_name: name, phase: job.action ?? "service" });
      lines.push(message);
    };
    const stopReplica = async (r: ReplicaSpec) => {
      d.supervisor.release(r.id);
      await d.driver.stop(r.id, d.stopGraceMs).catch(() => undefined);
      await d.driver.remove(r.id).catch(() => undefined);
    };
    let failure = "";
    if (job.action === "restart") {
      // One replica at a time, each back and healthy before the next goes: the router sends the
      // others the requests meanwhile (and holds them for a lone replica; see the router's retries).
      service.stopped = false;
      for (const r of service.replicas) {
        await stopReplica(r);
        await d.driver.start(r);
        d.supervisor.desire(r);
        try {
          await this.#healthCheck(app, [r], (level, message) => emit(level, message), async () => false);
        } catch (err) {
          if (!(err instanceof DeployFailure)) throw err;
          // The replica stays desired (the supervisor restarts it); the ones after it are untouched.
          failure = `Replica ${r.index + 1} of ${name} did not come back healthy: ${err.message}`;
          emit("error", failure);
          break;
        }
        emit("info", `Restarted replica ${r.index + 1}`);
      }
    }
    if (job.action === "stop") {
      const running = service.replicas.filter((r) => this.#running(r.id));
      for (const r of service.replicas) await stopReplica(r);
      service.stopped = true;
      emit("info", running.length > 0 ? `Stopped ${running.length} replica(s)` : "No replica was running");
    }
    if (job.action === "start") {
      // Starting a service that runs is done already: its running replicas are left as they are.
      const idle = service.replicas.filter((r) => !this.#running(r.id));
      for (const r of idle) {
        await d.driver.start(r);
        d.supervisor.desire(r);
      }
      service.stopped = false;
      emit("info", idle.length > 0 ? `Started ${idle.length} replica(s)` : `Every replica (${service.replicas.length}) was running already`);
    }
    await d.routingTableLock.run(async () => {
      await d.state.setApp(app);
      if (app.hosts.length > 0) await d.router.put(routeOf(app));
    });
    return { status: failure ? "failed" : "completed", error_message: failure, result: { phases: { [job.action ?? "service"]: lines.join("\n") } } };
  }

  /** RECONCILE_ROUTING: the route follows the app's current visibility (front doors from apps-builds). */
  async reconcile(job: DeployJob): Promise<DeployOutcome> {
    const d = this.#d;
    // Marked first: a deploy of the branch in flight reads its front doors again before its swap.
    await d.state.markFrontDoorsChanged(job.app_name, job.branch, Date.now());
    const app = d.state.appOf(job.app_name, job.branch);
    let message = "Nothing of this branch runs on this host.";
    if (!app) return { status: "completed", error_message: "", result: { phases: { reconcile: message } } };
    const readAt = Date.now();
    const release = await d.resolve({ ...job, image_tag: app.tag });
    await d.routingTableLock.run(async () => {
      // A deploy's swap may have replaced the record meanwhile, with front doors read after these.
      const current = d.state.appOf(job.app_name, job.branch);
      if (!current) return;
      if ((current.hostsReadAt ?? 0) <= readAt) Object.assign(current, { hosts: release.hosts, hostsReadAt: readAt });
      await d.state.setApp(current);
      if (current.hosts.length > 0) await d.router.put(routeOf(current));
      else await d.router.remove(current.key);
      message = current.hosts.length > 0 ? `Routed at ${current.hosts.join(", ")}` : "Private: the public route was removed";
    });
    d.log({ level: "info", message, phase: "reconcile" });
    return { status: "completed", error_message: "", result: { phases: { reconcile: message } } };
  }

  /**
   * A crashed replica comes back on another port (runtime-host's relocate): the host state names
   * the new port, and so does the route, now or at the next routing check when the router does
   * not answer.
   */
  async moveReplica(spec: ReplicaSpec, port: number): Promise<ReplicaSpec> {
    const moved: ReplicaSpec = { ...spec, port, env: { ...spec.env, PORT: String(port) } };
    const swap = (r: ReplicaSpec) => (r.id === spec.id ? moved : r);
    const holds = (app: DeployedApp) => Object.values(app.services).some((s) => s.replicas.some((r) => r.id === spec.id));
    const within = (app: DeployedApp): DeployedApp => ({
      ...app,
      services: Object.fromEntries(Object.entries(app.services).map(([name, s]) => [name, { ...s, replicas: s.replicas.map(swap) }])),
    });
    const d = this.#d;
    await d.routingTableLock.run(async () => {
      // A deploy in flight that carries the replica over routes the new port once it swaps.
      for (const f of d.state.allInflight()) if (holds(f.next)) await d.state.setInflight({ ...f, next: within(f.next), replicas: f.replicas.map(swap) });
      const app = d.state.apps().find(holds);
      if (!app) return;
      const next = within(app);
      await d.state.setApp(next);
      if (next.hosts.length > 0) await d.router.put(routeOf(next)).catch(() => undefined);
    });
    return moved;
  }

  /** After an agent start: the router gets the whole table again from the host state. */
  async reassertRoutes(): Promise<void> {
    await this.#d.routingTableLock.run(() => this.#d.router.assertAll(this.#routingTable()));
  }

  /**
   * The router gets the whole table again if the one it holds drifted from the host state (a
   * Caddy restart, a front door changed or deleted by hand); answers what drifted.
   */
  async restoreDriftedRoutes(): Promise<RoutingDrift | null> {
    return this.#d.routingTableLock.run(async () => {
      const routes = this.#routingTable();
      const drift = await this.#d.router.drift(routes);
      if (drift) await this.#d.router.assertAll(routes);
      return drift;
    });
  }

  #routingTable(): RouteSpec[] {
    return this.#d.state.apps().filter((a) => a.hosts.length > 0).map(routeOf);
  }
}
