/**
 * What this host runs, kept on disk (`<AGENT_RUN_DIR>/state.json`) so that an agent restart
 * changes nothing for the apps: the replicas keep running (the runtime driver adopts them), the
 * router is re-asserted from this record, and a deploy that was in flight is finished or cleaned
 * up from what it wrote here. Written atomically (temporary file, then rename).
 */
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import path from "node:path";
import type { RouteSpec } from "./router-types.ts";
import type { Colour, ReplicaSpec } from "./runtime/types.ts";

export interface DeployedService {
  /** Mount on the front door; null for an unrouted service. */
  mount: string | null;
  health: string | null;
  background: boolean;
  /** Stopped with a service action: its replicas are not desired. */
  stopped: boolean;
  replicas: ReplicaSpec[];
}

export interface DeployedApp {
  key: string;
  group: string;
  app: string;
  branch: string;
  tag: string;
  colour: Colour;
  deploymentId: string;
  /** Front door host names; empty for a private app. */
  hosts: string[];
  /** When `hosts` was asked of apps-builds (ms, this agent's clock); absent in older records. */
  hostsReadAt?: number;
  releaseDir: string;
  services: Record<string, DeployedService>;
  since: string;
}

/** A deploy between its first replica and its completion. */
export interface InflightDeploy {
  actionId: string;
  key: string;
  colour: Colour;
  replicas: ReplicaSpec[];
  swapCommitted: boolean;
  /** The app as it will be once the swap is committed. */
  next: DeployedApp;
  /** The app as it ran when the deploy began: the colour to drain (absent in older records). */
  previous?: DeployedApp;
  /** Output of each phase so far, kept with the record: a deploy resumed after a restart still shows it. */
  phases?: Record<string, string[]>;
  /** The variables the release runs with: a resumed deploy reports them as any other (its history's env_vars_snapshot). */
  env?: Record<string, string>;
}

interface StateFile {
  apps: Record<string, DeployedApp>;
  inflight: Record<string, InflightDeploy>;
  /** By `<app>/<branch>`: when a route reconcile (a visibility flip) last came for the branch. */
  frontDoorsChanged?: Record<string, number>;
}

/** How long a route reconcile's mark is kept: far longer than any deploy takes from its read to its swap. */
const FRONT_DOORS_MARK_KEPT_MS = 24 * 3600_000;

/** The key of a branch first deployed on this host; it stays the branch's key across group renames. */
export function appKey(group: string, app: string, branch: string): string {
  return `${group}/${app}/${branch}`;
}

/** The router's view of a deployed app: one front door, each routed service's live upstreams. */
export function routeOf(app: DeployedApp): RouteSpec {
  return {
    key: app.key,
    hosts: app.hosts,
    mounts: Object.entries(app.services)
      .filter(([, s]) => s.mount !== null && !s.background)
      .map(([service, s]) => ({
        service,
        path: s.mount!,
        upstreams: s.stopped ? [] : s.replicas.filter((r) => r.port !== null).map((r) => `127.0.0.1:${r.port}`),
      })),
  };
}

export class HostState {
  readonly #file: string;
  #state: StateFile = { apps: {}, inflight: {} };
  /** The apps by `<app>/<branch>`: app names are unique across groups, so this names a branch whatever its group. */
  #byBranch = new Map<string, DeployedApp>();
  #writing: Promise<void> = Promise.resolve();

  constructor(runDir: string) {
    this.#file = path.join(runDir, "state.json");
  }

  async load(): Promise<void> {
    try {
      const parsed = JSON.parse(await readFile(this.#file, "utf8")) as Partial<StateFile>;
      this.#state = { apps: parsed.apps ?? {}, inflight: parsed.inflight ?? {}, frontDoorsChanged: parsed.frontDoorsChanged ?? {} };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
    this.#byBranch = new Map(this.apps().map((a) => [`${a.app}/${a.branch}`, a]));
  }

  apps(): DeployedApp[] {
    return Object.values(this.#state.apps);
  }

  app(key: string): DeployedApp | undefined {
    return this.#state.apps[key];
  }

  /** The branch of an app deployed here, whatever group it was deployed in. */
  appOf(app: string, branch: string): DeployedApp | undefined {
    return this.#byBranch.get(`${app}/${branch}`);
  }

  inflight(actionId: string): InflightDeploy | undefined {
    return this.#state.inflight[actionId];
  }

  allInflight(): InflightDeploy[] {
    return Object.values(this.#state.inflight);
  }

  async setApp(app: DeployedApp): Promise<void> {
    this.#state.apps[app.key] = app;
    this.#byBranch.set(`${app.app}/${app.branch}`, app);
    await this.save();
  }

  async removeApp(key: string): Promise<void> {
    const app = this.#state.apps[key];
    if (app) this.#byBranch.delete(`${app.app}/${app.branch}`);
    delete this.#state.apps[key];
    await this.save();
  }

  /**
   * A group renamed (identity's group_renamed): what runs here in it is labelled with its new
   * slug, so its log lines and the inventory name the group as it now is. Keys stay as they are.
   */
  async relabelGroup(previous: string, slug: string): Promise<number> {
    const apps = [...this.apps(), ...this.allInflight().map((d) => d.next)].filter((a) => a.group === previous);
    for (const app of apps) {
      app.group = slug;
      for (const service of Object.values(app.services)) for (const replica of service.replicas) replica.group = slug;
    }
    for (const d of this.allInflight()) for (const replica of d.replicas) if (replica.group === previous) replica.group = slug;
    if (apps.length > 0) await this.save();
    return apps.length;
  }

  /**
   * A route reconcile came for a branch at `at`: a deploy of it routes the front doors it read at
   * its start, and one read before then may miss the visibility flip the reconcile is for.
   */
  async markFrontDoorsChanged(app: string, branch: string, at: number): Promise<void> {
    const marks = (this.#state.frontDoorsChanged ??= {});
    for (const [k, t] of Object.entries(marks)) if (at - t > FRONT_DOORS_MARK_KEPT_MS) delete marks[k];
    marks[`${app}/${branch}`] = Math.max(at, marks[`${app}/${branch}`] ?? 0);
    await this.save();
  }

  /** Whether front doors of a branch read at `readAt` may be older than a visibility flip. */
  frontDoorsChangedSince(app: string, branch: string, readAt: number): boolean {
    const mark = this.#state.frontDoorsChanged?.[`${app}/${branch}`];
    return mark !== undefined && mark >= readAt;
  }

  async setInflight(d: InflightDeploy): Promise<void> {
    this.#state.inflight[d.actionId] = d;
    await this.save();
  }

  async clearInflight(actionId: string): Promise<void> {
    delete this.#state.inflight[actionId];
    await this.save();
  }

  /**
   * Writes are serialised: the last one wins, none interleave. A write that failed (a full disk)
   * fails its own caller only; the next one writes the whole state again.
   */
  save(): Promise<void> {
    const snapshot = JSON.stringify(this.#state, null, 2);
    this.#writing = this.#writing.catch(() => undefined).then(async () => {
      await mkdir(path.dirname(this.#file), { recursive: true });
      const tmp = `${this.#file}.${process.pid}.tmp`;
      await writeFile(tmp, snapshot);
      await rename(tmp, this.#file);
    });
    return this.#writing;
  }
}
