/**
 * The runtime driver interface (ARCHITECTURE section 5): how the agent runs the replicas of an
 * app's services. `process` (child processes, the default) and `docker` (Docker Engine API) both
 * implement it; the deployer, the supervisor and the services inventory only ever see this.
 */

/** Blue/green: a deploy starts the other colour beside the one serving. */
export type Colour = "blue" | "green";

/** Everything a driver needs to start one replica of one service. */
export interface ReplicaSpec {
  /** Stable and unique on the host: `<group>.<app>.<branch>.<service>.<colour>.<index>` made filesystem-safe. */
  id: string;
  group: string;
  app: string;
  branch: string;
  service: string;
  colour: Colour;
  /** 0-based replica index within the service. */
  index: number;
  /** The image tag the release was built as (`{branch}-{hash}`). */
  tag: string;
  /** The deployment that started it: its output's log lines carry it. Absent in older records. */
  deploymentId?: string;
  /** The extracted release (the build output) the command runs in. */
  releaseDir: string;
  /** The service's `run` command, run through `sh -c`. */
  command: string;
  /** The app's variables plus PORT (when the service has a port) and PLATFORM_* names. */
  env: Record<string, string>;
  /** The port the replica must listen on; null for a background service. */
  port: number | null;
  /** Memory limit; null means none. */
  memoryMb: number | null;
}

export interface ExitInfo {
  code: number | null;
  signal: string | null;
  /** Killed by the kernel's OOM killer (cgroup memory limit reached). */
  oomKilled: boolean;
  at: Date;
}

/** An HTTP client a replica can run, first found of curl, python3, node (spec doc 2 section 4.10). */
export type HttpClient = "curl" | "python3" | "node" | "none";

/** What was found a replica can run, and when it was looked for. */
export interface Capability {
  httpClient: HttpClient;
  probedAt: Date;
}

export interface ReplicaState {
  spec: ReplicaSpec;
  /** Driver-specific handle: a pid for `process`, a container id for `docker`. */
  handle: string;
  startedAt: Date;
  running: boolean;
  exit: ExitInfo | null;
  /** Absent when the driver does not probe (docker). */
  capability?: Capability;
  /** The cgroup v2 its sockets are known by, for the tenant fence to let it reach its own port (process driver). */
  socketCgroup?: string;
}

export interface OutputLine {
  replicaId: string;
  /** The replica's spec, so a listener needs no lookup per line (which app, service, colour). */
  spec: ReplicaSpec;
  stream: "stdout" | "stderr";
  line: string;
  at: Date;
}

export interface RuntimeDriver {
  readonly name: "process" | "docker";
  /** Starts one replica; resolves once the process/container is started (not yet healthy). */
  start(spec: ReplicaSpec): Promise<ReplicaState>;
  /** SIGTERM (or docker stop), then SIGKILL after `graceMs`; resolves when it is gone. Idempotent. */
  stop(replicaId: string, graceMs: number): Promise<void>;
  /** Every replica the driver knows of, running or exited and not yet removed. */
  list(): ReplicaState[];
  /** Forgets an exited replica (and its files). */
  remove(replicaId: string): Promise<void>;
  /** The last `n` (default 30) lines of the replica's output, stdout and stderr merged in order. */
  tail(replicaId: string, n?: number): Promise<string[]>;
  /** Called once per replica exit that was not asked for with stop(). */
  onExit(listener: (state: ReplicaState) => void): void;
  /** Called for every line a replica writes, stdout and stderr. */
  onOutput(listener: (line: OutputLine) => void): void;
  /**
   * After an agent restart: finds the replicas still running from before (recorded on disk by
   * the driver), resumes watching them and their output, and returns them. Replicas that died
   * meanwhile are returned with running false.
   */
  adopt(): Promise<ReplicaState[]>;
  /** Stops watching (not the replicas: they keep serving while the agent restarts). */
  close(): Promise<void>;
}
