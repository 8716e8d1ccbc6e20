/**
 * The host agent: one per host. It heartbeats, answers its health endpoints and its fast RPCs
 * (GIT_PREFLIGHT), and runs the deploy lane's work (builds; deploys, undeploys and service actions
 * on its runtime driver behind the router), shipping its log lines to health-aggregator.
 */
import http from "node:http";
import { resolve as resolvePath } from "node:path";
import os from "node:os";
import { readFileSync } from "node:fs";
import { agentEnv, allowFileRepos, loadConfig, type Config } from "@platform/config";
import { createLogger, type Logger } from "@platform/logger";
import { connectBus, parseGroupRenamed, runConsumer, subjects, traceHeaders, type EventEnvelope } from "@platform/bus";
import { LogShipper } from "@platform/logship";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService, DeployQueueService } from "@platform/proto";
import { startWorkLane } from "./work.ts";
import { HEARTBEAT_INTERVAL_MS, LoadSampler, sampleHeartbeat } from "./heartbeat.ts";
import { clearAbandonedWork } from "./work-dir.ts";
import { serveGitPreflight, type PreflightDeps } from "./preflight.ts";
import { publishImage } from "./image-store.ts";
import { startRuntimeHost } from "./runtime-host.ts";
import { ephemeralRange, overlaps, parsePortRange } from "./replica-ports.ts";
import { releaseDir } from "./deployer.ts";
import { removePartialImages } from "./builder.ts";
import { hostSecrets, Sandbox } from "./sandbox.ts";
import { controlPlaneAddresses, keepTenantFence, type OwnPort, type TenantFence } from "./tenant-fence.ts";
import { hostShare, probeTenantsCgroup, removeIdleCgroups, type CgroupParent } from "./cgroups.ts";

export type AgentConfig = Config<typeof agentEnv>;

const VERSION: string = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;
/** A build cgroup younger than this may be another agent's on the same host, about to be joined. */
const LEFTOVER_CGROUP_AGE_MS = 60_000;

export interface Agent {
  port: number;
  /** NATS subjects of the fast RPCs this agent answers (with the bus prefix). */
  rpcSubjects: string[];
  beat(): Promise<void>;
  close(): Promise<void>;
}

export async function build(config: AgentConfig = loadConfig(agentEnv), logger: Logger = createLogger({ service: "agent", level: config.LOG_LEVEL })): Promise<Agent> {
  if (config.AGENT_HOST_ID === "any") {
    throw new Error("AGENT_HOST_ID 'any' is reserved: agent.rpc.any.<op> is the subject of requests for any agent");
  }
  const startedAt = new Date();
  const bus = await connectBus({ url: config.NATS_URL, name: `agent-${config.AGENT_HOST_ID}`, prefix: config.BUS_PREFIX ?? "", logger });

  // Before any preflight or build of this agent could be using the work directory.
  const cleared = await clearAbandonedWork(resolvePath(config.AGENT_WORK_DIR));
  if (cleared.workspaces > 0) logger.info(cleared, "work left by a stopped agent cleared (workspaces removed, build commands still running in them killed)");
  const preflightDeps: PreflightDeps = {
    workDir: resolvePath(config.AGENT_WORK_DIR),
    allowFileRepos: allowFileRepos(config),
  };
  const preflight = serveGitPreflight({ bus, hostId: config.AGENT_HOST_ID, deps: preflightDeps, logger });
  const shipper = new LogShipper({ bus, defaults: { instance_id: config.AGENT_HOST_ID }, logger });
  // npm start keeps the root key and the servers' data under .data: no tenant code may read them.
  const hidden = [
    ...[config.AGENT_WORK_DIR, config.AGENT_IMAGE_DIR, config.AGENT_RUN_DIR, ".data"].map((p) => resolvePath(p)),
    ...hostSecrets({ home: os.homedir(), pathDirs: (process.env.PATH ?? "").split(":"), execPath: process.execPath, dockerSocket: config.AGENT_DOCKER_SOCKET }),
  ];
  // Tenant code runs as the tenant user, fenced off the host's own services, before any of it starts.
  const runAs = config.AGENT_TENANT_UID > 0 ? { uid: config.AGENT_TENANT_UID, gid: config.AGENT_TENANT_UID } : null;
  let fence: TenantFence | null = null;
  // The replicas' ports, once the runtime host keeps them (it adopts those still running).
  let replicaPorts = (): number[] => [];
  let ownPorts = (): OwnPort[] => [];
  if (runAs) {
    const deniedNets = [
      ...(config.AGENT_TENANT_DENIED_NETS ? config.AGENT_TENANT_DENIED_NETS.split(",") : []),
      ...(await controlPlaneAddresses([config.NATS_URL, config.DEPLOY_QUEUE_URL, config.APPS_BUILDS_URL])),
    ];
    fence = await keepTenantFence({ uid: runAs.uid, routerPorts: [config.PLATFORM_ROUTER_PORT], deniedNets }, logger, { replicaPorts: () => replicaPorts(), ownPorts: () => ownPorts() });
  }
  // A replica that crashed or came back is told at once, not at the next heartbeat: the services
  // route would say not_running for up to 30 s of an app serving again (or running while it is down).
  let beatOnChange: (() => void) | null = null;
  const replicaPortRange = parsePortRange(config.AGENT_REPLICA_PORTS);
  const ephemeral = await ephemeralRange();
  if (ephemeral && overlaps(replicaPortRange, ephemeral)) {
    logger.warn(
      { replicaPorts: config.AGENT_REPLICA_PORTS, ephemeral: `${ephemeral.first}-${ephemeral.last}` },
      "AGENT_REPLICA_PORTS overlaps the kernel's ephemeral range: a replica's port may be handed to another process, a tenant's included, before the replica takes it",
    );
  }
  const tenants = await hostShare(config.AGENT_TENANT_MEMORY_PERCENT, config.AGENT_TENANT_PIDS_PERCENT);
  logger.info({ memoryMb: tenants.memoryMb || "no limit", processes: tenants.pidsMax || "no limit" }, "what tenant code may use together on this host");
  const runtime = await startRuntimeHost({
    hostId: config.AGENT_HOST_ID,
    runDir: config.AGENT_RUN_DIR,
    imageDir: config.AGENT_IMAGE_DIR,
    runtime: config.AGENT_RUNTIME as "process" | "docker",
    dockerSocket: config.AGENT_DOCKER_SOCKET,
    routerAdminUrl: config.AGENT_ROUTER_ADMIN_URL,
    routerPort: config.PLATFORM_ROUTER_PORT,
    hide: hidden,
    runAs,
    pidsMax: config.AGENT_PIDS_MAX,
    tenants,
    replicaPortRange,
    healthTimeoutMs: config.AGENT_HEALTH_CHECK_TIMEOUT_S * 1000,
    logLinesPerMinute: config.AGENT_LOG_LINES_PER_MINUTE,
    apps: createServiceClient(AppsBuildsService, config.APPS_BUILDS_URL, { timeoutMs: 15_000, token: config.PLATFORM_INTERNAL_TOKEN }),
    bus,
    logger,
    ship: (line) => void shipper.ship(line),
    onChange: () => beatOnChange?.(),
    guardPort: fence ? (port) => fence.guard(port) : undefined,
    openOwnPort: fence ? (own) => fence.openOwnPort(own) : undefined,
  });
  replicaPorts = () => runtime.replicaPorts();
  ownPorts = () => runtime.ownPorts();
  // Replicas adopted from before this start are closed to the outside (and opened to themselves) now, not at the next renewal.
  await fence?.renew();

  // Build commands die with the agent that ran them; the cgroups they ran in stayed behind.
  const leftBehind = async (parent: CgroupParent | null) => (parent ? removeIdleCgroups(parent, "build-", LEFTOVER_CGROUP_AGE_MS) : 0);
  const buildMemory = probeTenantsCgroup("memory", tenants).then((probe) => {
    if (probe.ok) return probe.cgroup;
    logger.warn({ reason: probe.reason }, "build commands run without a memory limit");
    return null;
  });
  const buildPids =
    config.AGENT_PIDS_MAX > 0
      ? probeTenantsCgroup("pids", tenants).then((probe) => {
          if (probe.ok) return probe.cgroup;
          logger.warn({ reason: probe.reason }, "build commands run without a process limit");
          return null;
        })
      : null;
  const buildCpu = probeTenantsCgroup("cpu", tenants).then((probe) => {
    if (probe.ok) return probe.cgroup;
    logger.warn({ reason: probe.reason }, "build commands share the CPU by process, not weighed together");
    return null;
  });
  void Promise.all([buildMemory.then(leftBehind), buildPids?.then(leftBehind), buildCpu.then(leftBehind)]).then(([memory = 0, pids = 0, cpu = 0]) => {
    if (memory + pids + cpu > 0) logger.info({ removed: memory + pids + cpu }, "cgroups of builds run by a stopped agent removed");
  });
  const load = new LoadSampler();
  const beat = async () => {
    // The disk reported is the one deployed releases and replica output fill, not the agent's cwd.
    const hb = await sampleHeartbeat(config.AGENT_HOST_ID, VERSION, startedAt, resolvePath(config.AGENT_RUN_DIR), () => runtime.inventory(), load);
    bus.nc.publish(bus.subject(subjects.heartbeat(config.AGENT_HOST_ID)), JSON.stringify(hb), { headers: traceHeaders() });
  };
  const beatNow = () => void beat().catch((err: unknown) => logger.warn({ err }, "heartbeat failed"));
  // Changes are told from here on, the first beat's CPU window included: a replica the supervisor
  // brings back meanwhile is in the beat sent last (each beat reads the inventory when sent).
  beatOnChange = beatNow;
  await beat();
  const timer = setInterval(beatNow, HEARTBEAT_INTERVAL_MS);
  // Every agent hears of a renamed group (identity's group_renamed) and relabels what it runs in it;
  // the fleet's view of its services follows at once rather than at the next heartbeat. A durable
  // of its own, acked once the host state is saved: a rename while the agent was down (or a crash
  // before the save) is applied when it is back; relabelling again is a no-op. Renames from before
  // the agent's first start concern nothing it runs.
  const renames = await runConsumer({
    bus,
    stream: subjects.streams(bus.prefix).events.name,
    durable: `agent-${config.AGENT_HOST_ID}-group-renamed`,
    filterSubject: bus.subject(subjects.events.groupRenamed),
    startAt: "new",
    logger,
    async handle(msg) {
      const { previous_slug, slug } = parseGroupRenamed(msg.json<EventEnvelope>().data ?? {});
      const relabelled = await runtime.relabelGroup(previous_slug, slug);
      if (relabelled === 0) return;
      logger.info({ previous_slug, slug, apps: relabelled }, "group renamed: its apps here relabelled");
      await beat();
    },
  });
  const partials = await removePartialImages(resolvePath(config.AGENT_IMAGE_DIR));
  if (partials > 0) logger.info({ removed: partials }, "partial image archives from before the agent started removed");
  const work = await startWorkLane({
    bus,
    hostId: config.AGENT_HOST_ID,
    queue: createServiceClient(DeployQueueService, config.DEPLOY_QUEUE_URL, { timeoutMs: 15_000, token: config.PLATFORM_INTERNAL_TOKEN }),
    logger,
    log: (line) => void shipper.ship(line),
    build: {
      logRoom: (of) => shipper.room(of),
      workDir: resolvePath(config.AGENT_WORK_DIR),
      imageDir: resolvePath(config.AGENT_IMAGE_DIR),
      allowFileRepos: allowFileRepos(config),
      timeoutMs: config.AGENT_BUILD_TIMEOUT_S * 1000,
      imageMaxMb: config.AGENT_IMAGE_MAX_MB,
      logLinesPerMinute: config.AGENT_LOG_LINES_PER_MINUTE,
      publishImage: (app, tag, file) => publishImage(bus, app, tag, file),
      releaseDir: (job) => releaseDir(resolvePath(config.AGENT_RUN_DIR), job.group_slug, job.app_name, job.branch, job.tag),
      sandbox: new Sandbox({ hide: hidden, runAs, logger, what: "build commands" }),
      memory: { limitMb: config.AGENT_BUILD_MEMORY_MB, cgroup: () => buildMemory },
      ...(buildPids ? { pids: { max: config.AGENT_PIDS_MAX, cgroup: () => buildPids } } : {}),
      cpu: { cgroup: () => buildCpu },
    },
    deployer: runtime.deployer,
    resumable: runtime.resumable,
    onFinished: beatNow,
  });
  // The server knows the subscriptions before the agent says it is ready.
  await bus.nc.flush();

  const server = http.createServer((req, res) => {
    const path = req.url?.split("?")[0];
    if (req.method === "GET" && (path === "/healthz" || path === "/readyz")) {
      const ready = path === "/healthz" || !bus.nc.isClosed();
      res.writeHead(ready ? 200 : 503, { "content-type": "application/json" });
      res.end(JSON.stringify({ host_id: config.AGENT_HOST_ID, ready, version: VERSION }));
      return;
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ detail: "Not Found" }));
  });
  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(config.AGENT_HEALTH_PORT, config.AGENT_HEALTH_HOST, () => resolve());
    });
  } catch (err) {
    clearInterval(timer);
    fence?.stop();
    await renames.stop();
    await work.stop();
    await preflight.stop();
    await runtime.close();
    await shipper.close();
    await bus.close();
    throw err;
  }
  const port = (server.address() as { port: number }).port;
  logger.info({ host_id: config.AGENT_HOST_ID, port }, "agent ready");

  return {
    port,
    rpcSubjects: preflight.subjects,
    beat,
    async close() {
      clearInterval(timer);
      fence?.stop();
      await renames.stop();
      await work.stop();
      await preflight.stop();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await runtime.close();
      await shipper.close();
      await bus.close();
    },
  };
}
