/**
 * The agent's running apps: the runtime driver, the supervisor that restarts crashed replicas,
 * the router, and the host state that ties them together across agent restarts. Replica output
 * is shipped as log source `container`; supervisor events as source `agent`; both name the group
 * the branch is in now, which a group rename changes under running replicas.
 */
import path from "node:path";
import type { Client } from "@connectrpc/connect";
import { publishEvent, subjects, type Bus } from "@platform/bus";
import type { Logger } from "@platform/logger";
import type { LogLineInput } from "@platform/logship";
import type { AppsBuildsService } from "@platform/proto";
import type { TenantShare } from "./cgroups.ts";
import { Deployer, type DeployerDeps, type DeployJob } from "./deployer.ts";
import { portIsFree, replicaPortIn, type PortRange } from "./replica-ports.ts";
import type { InventoryEntry } from "./heartbeat.ts";
import { HostState } from "./host-state.ts";
import { deleteImages, fetchImage } from "./image-store.ts";
import { DROPPED_NOTICE_MS, LogRateLimit } from "./log-rate-limit.ts";
import { Mutex } from "./mutex.ts";
import { CaddyRouter } from "./router.ts";
import { DockerDriver } from "./runtime/docker.ts";
import { ProcessDriver } from "./runtime/process.ts";
import type { ReplicaSpec, RuntimeDriver } from "./runtime/types.ts";
import type { TenantUser } from "./sandbox.ts";
import type { OwnPort } from "./tenant-fence.ts";
import { describeExit, Supervisor } from "./supervisor.ts";
import { untilAnswered } from "./until-answered.ts";

export interface RuntimeHostOptions {
  hostId: string;
  runDir: string;
  imageDir: string;
  runtime: "process" | "docker";
  dockerSocket: string;
  routerAdminUrl: string;
  routerPort: number;
  /** What a sandboxed replica must not see: the agent's other files and the platform's secrets. */
  hide: string[];
  /** The user sandboxed replicas run as (AGENT_TENANT_UID); null: the agent's own. */
  runAs: TenantUser | null;
  /** The processes and threads one replica may run together (AGENT_PIDS_MAX); 0: no limit. */
  pidsMax: number;
  /** What all tenant code of the host may use together (hostShare). */
  tenants: TenantShare;
  healthTimeoutMs: number;
  /** Lines of output one replica may ship a minute (AGENT_LOG_LINES_PER_MINUTE, log-rate-limit.ts); 0: no limit. */
  logLinesPerMinute: number;
  /** How often the routing table Caddy holds is checked for drift from this host's record; ROUTER_CHECK_MS unless set. */
  routerCheckMs?: number;
  apps: Client<typeof AppsBuildsService>;
  /** Where images this host lacks are fetched from (the fleet's image store). */
  bus: Bus;
  logger: Logger;
  ship(line: LogLineInput): void;
  /** A replica crashed or was restarted: what the host runs changed outside any action. */
  onChange?(): void;
  /** The ports replicas listen on (AGENT_REPLICA_PORTS, replica-ports.ts). */
  replicaPortRange: PortRange;
  /** Closes a replica's port to connections from outside the host, before the replica listens on it (the tenant fence). */
  guardPort?(port: number): Promise<void>;
  /** Lets a replica through the tenant fence to its own port, before it starts. */
  openOwnPort?(own: OwnPort): Promise<void>;
}

/** How often the router is checked for drift (it then gets the whole table again). */
const ROUTER_CHECK_MS = 5_000;
const DRAIN_MS = 2_000;
/** How long a port handed out to a new replica is kept from others before the replica holds it. */
const HANDED_OUT_MS = 60_000;
const STOP_GRACE_MS = 10_000;
/** How long a deploy keeps asking apps-builds for its release while it is out of reach (a restart, say). */
const RESOLVE_PATIENCE_MS = 30_000;

export interface RuntimeHost {
  deployer(bind: { log: DeployerDeps["log"]; phase: DeployerDeps["phase"] }): Deployer;
  inventory(): { name: string; inventory: InventoryEntry[]; containers: { running: number; total: number } };
  /** The ports of every replica this host keeps (running or to be restarted). */
  replicaPorts(): number[];
  /** The running replicas' own ports, with the cgroups their sockets are known by. */
  ownPorts(): OwnPort[];
  /** Deploys in flight when the agent last stopped. */
  resumable(): Array<{ actionId: string; actionType: string }>;
  /** A group renamed: what runs here in it is labelled with its new slug; answers how many apps. */
  relabelGroup(previous: string, slug: string): Promise<number>;
  close(): Promise<void>;
}

export async function startRuntimeHost(o: RuntimeHostOptions): Promise<RuntimeHost> {
  const runDir = path.resolve(o.runDir);
  // A new replica's port is closed to the outside, and opened to the replica itself, while the
  // replica starts (an nft call takes about as long as a process starting to listen); a deploy
  // waits for both before its swap.
  const guarding = new Set<Promise<void>>();
  const guard = (done: Promise<void> | undefined) => {
    if (!done) return;
    guarding.add(done);
    void done.finally(() => guarding.delete(done));
  };
  const openOwnPort = o.openOwnPort;
  const ownPort = openOwnPort ? (cgroup: string, port: number) => guard(openOwnPort({ cgroup, port })) : undefined;
  const driver: RuntimeDriver =
    o.runtime === "docker"
      ? new DockerDriver({ socketPath: o.dockerSocket, runDir, logger: o.logger })
      : new ProcessDriver({ runDir, hide: o.hide, runAs: o.runAs, pidsMax: o.pidsMax, tenants: o.tenants, logger: o.logger, ownPort });
  const state = new HostState(runDir);
  await state.load();
  const router = new CaddyRouter({ adminUrl: o.routerAdminUrl, listenPort: o.routerPort, logger: o.logger });

  const groupOf = (spec: { app: string; branch: string; group: string }) => state.appOf(spec.app, spec.branch)?.group ?? spec.group;
  /** Where a line about a replica belongs. */
  const ofReplica = (spec: { app: string; branch: string; group: string; service: string }) => ({
    app_name: spec.app,
    branch: spec.branch,
    group_slug: groupOf(spec),
    service_name: spec.service,
    instance_id: o.hostId,
  });

  const logRate = new LogRateLimit<ReplicaSpec>({ perMinute: o.logLinesPerMinute });
  const tellDropped = () => {
    for (const { key: replica, dropped, since, context: spec } of logRate.notices()) {
      o.ship({
        source: "container",
        level: "warning",
        ...ofReplica(spec),
        deployment_id: spec.deploymentId,
        message: `[${dropped} line(s) of this replica's output dropped since ${since.toISOString()}: a replica may log ${o.logLinesPerMinute} lines a minute]`,
        metadata: { replica, colour: spec.colour, tag: spec.tag, dropped_lines: dropped, event: "log_rate_limited" },
      });
    }
  };
  const noticeTimer = setInterval(tellDropped, DROPPED_NOTICE_MS);
  noticeTimer.unref();
  driver.onOutput((line) => {
    const { spec } = line;
    if (!logRate.admit(spec.id, spec)) return;
    o.ship({
      source: "container",
      level: line.stream === "stderr" ? "warning" : "info",
      ...ofReplica(spec),
      deployment_id: spec.deploymentId,
      message: line.line,
      ts: line.at.toISOString(),
      metadata: { replica: spec.id, stream: line.stream, colour: spec.colour, tag: spec.tag },
    });
  });
  /** The ports of every replica this host keeps (running or to be restarted). */
  const heldPorts = () => driver.list().flatMap((r) => (r.spec.port === null ? [] : [r.spec.port]));
  // A port handed out is the new replica's before it shows in the driver's list: one at a time,
  // and not handed out again meanwhile.
  const portLock = new Mutex();
  const handedOut = new Map<number, number>();
  const replicaPort = async () => {
    const port = await portLock.run(async () => {
      for (const [p, at] of handedOut) if (Date.now() - at > HANDED_OUT_MS) handedOut.delete(p);
      const chosen = await replicaPortIn(o.replicaPortRange, new Set([...heldPorts(), ...handedOut.keys()]));
      handedOut.set(chosen, Date.now());
      return chosen;
    });
    guard(o.guardPort?.(port));
    return port;
  };
  const portsGuarded = async () => {
    await Promise.all([...guarding]);
  };
  // The replicas' port mover, once the routes are kept (restarts before that keep their port).
  let routesKeeper: Deployer | null = null;
  const supervisor = new Supervisor({
    driver,
    logger: o.logger,
    // Any process of the host may listen on a crashed replica's free port (a tenant's, to take its
    // requests): the replica comes back on another, which the route names from the crash on (no
    // one can know it in advance), and on yet another if that one was taken before the restart.
    relocate: async (spec, when) => {
      if (spec.port === null || !routesKeeper) return spec;
      if (when === "crashed") return routesKeeper.moveReplica(spec, await replicaPort());
      if (await portIsFree(spec.port)) return spec;
      const moved = await routesKeeper.moveReplica(spec, await replicaPort());
      o.ship({
        source: "agent",
        level: "warning",
        ...ofReplica(spec),
        message: `Port ${spec.port} of replica ${spec.id} was taken by another process while the replica was down; it restarts on port ${moved.port}, and its route follows.`,
        metadata: { replica: spec.id, event: "port_moved", from: spec.port, to: moved.port },
      });
      return moved;
    },
    onCrashLoop: ({ spec, looping, crashes, exit }) => {
      const data = {
        group_slug: groupOf(spec),
        app_name: spec.app,
        branch: spec.branch,
        service_name: spec.service,
        tag: spec.tag,
        replica: spec.id,
        looping,
        crashes,
        last_exit: describeExit(exit),
        at: new Date().toISOString(),
      };
      publishEvent(o.bus, subjects.events.serviceCrashLoop, data).catch((err: unknown) => o.logger.warn({ err, ...data }, "could not tell of a crash loop"));
    },
    onEvent: (e) => {
      o.ship({
        source: "agent",
        level: e.kind === "restarted" ? "info" : e.kind === "crashed" ? "warning" : "error",
        ...ofReplica(e),
        message: e.message,
        metadata: { replica: e.replicaId, event: e.kind, exit: e.exit ?? null },
      });
      o.onChange?.();
    },
  });

  // What ran before this agent started keeps running: adopt it. A replica that died meanwhile
  // is restarted by the supervisor, which logs the event; one the driver has no record of at all
  // is started afresh.
  const adopted = new Map((await driver.adopt()).map((r) => [r.spec.id, r]));
  for (const app of state.apps()) {
    for (const service of Object.values(app.services)) {
      if (service.stopped) continue;
      for (const spec of service.replicas) {
        if (!adopted.has(spec.id)) {
          await driver.start(spec).catch((err: unknown) => o.logger.error({ err, replica: spec.id }, "replica not restarted after the agent restart"));
        }
        supervisor.desire(spec);
      }
    }
  }

  const deps = {
    hostId: o.hostId,
    runDir,
    imageDir: path.resolve(o.imageDir),
    driver,
    supervisor,
    router,
    state,
    routingTableLock: new Mutex(),
    fetchImage: (app: string, tag: string, file: string) => fetchImage(o.bus, app, tag, file),
    deleteImages: (app: string, tags: string[]) => deleteImages(o.bus, app, tags),
    healthTimeoutMs: o.healthTimeoutMs,
    drainMs: DRAIN_MS,
    stopGraceMs: STOP_GRACE_MS,
    replicaPort,
    portsGuarded,
  };
  const resolve = async (job: DeployJob) => {
    const r = await untilAnswered(() => o.apps.resolveRelease({ appName: job.app_name, branch: job.branch, groupSlug: job.group_slug, imageTag: job.image_tag ?? "" }), {
      forMs: RESOLVE_PATIENCE_MS,
    });
    return { imageTag: r.imageTag, config: JSON.parse(r.configJson) as Record<string, unknown>, env: r.env, hosts: r.hosts };
  };
  const deployer = (bind: { log: DeployerDeps["log"]; phase: DeployerDeps["phase"] }) => new Deployer({ ...deps, resolve, ...bind });
  routesKeeper = deployer({ log: () => undefined, phase: async () => false });

  // The whole table at every agent start (the router may hold what an agent killed mid-change
  // left there), as soon as the router answers, then again whenever the table it holds drifts
  // from this host's record: a Caddy restart, a front door changed or deleted by hand.
  let asserted = false;
  const reassert = async () => {
    try {
      if (!asserted) {
        await routesKeeper.reassertRoutes();
        asserted = true;
        o.logger.info({ apps: state.apps().length }, "routing table asserted");
        return;
      }
      const drift = await routesKeeper.restoreDriftedRoutes();
      if (drift) o.logger.warn({ drift }, "routing table drifted from this host's record; asserted again");
    } catch (err) {
      o.logger.warn({ err }, "router not reachable; routes are asserted again when it answers");
    }
  };
  await reassert();
  let checking: Promise<void> | null = null;
  const timer = setInterval(() => {
    checking ??= reassert().finally(() => {
      checking = null;
    });
  }, o.routerCheckMs ?? ROUTER_CHECK_MS);
  timer.unref();

  return {
    deployer,
    resumable: () => state.allInflight().map((d) => ({ actionId: d.actionId, actionType: "DEPLOY" })),
    replicaPorts: heldPorts,
    ownPorts: () => driver.list().flatMap((r) => (r.running && r.socketCgroup && r.spec.port !== null ? [{ cgroup: r.socketCgroup, port: r.spec.port }] : [])),
    inventory() {
      const running = new Map(driver.list().filter((r) => r.running).map((r) => [r.spec.id, r]));
      const inventory: InventoryEntry[] = state.apps().flatMap((a) =>
        Object.entries(a.services).map(([service, s]) => {
          const capability = s.replicas.map((r) => running.get(r.id)?.capability).find((c) => c !== undefined);
          return {
            group: a.group,
            app: a.app,
            branch: a.branch,
            service,
            tag: a.tag,
            colour: a.colour,
            replicas_desired: s.stopped ? 0 : s.replicas.length,
            replicas_running: s.replicas.filter((r) => running.has(r.id)).length,
            http_client: capability?.httpClient ?? null,
            capability_probed_at: capability?.probedAt.toISOString() ?? null,
          };
        }),
      );
      return { name: driver.name, inventory, containers: { running: running.size, total: driver.list().length } };
    },
    relabelGroup: (previous, slug) => state.relabelGroup(previous, slug),
    async close() {
      clearInterval(timer);
      await checking;
      await supervisor.close();
      await driver.close();
      clearInterval(noticeTimer);
      tellDropped();
    },
  };
}
