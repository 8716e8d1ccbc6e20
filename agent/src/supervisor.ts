/**
 * The supervisor: restarts a replica that died on its own while it is still desired, with
 * exponential backoff (1 s doubling to 30 s, back to 1 s once a run lasted 60 s), and reports
 * every crash and restart, and when a replica is crash-looping (CRASH_LOOP_CRASHES crashes with
 * no run of 60 s between them) and when that ends (a run of 60 s, or the replica released).
 * The deployer says what is desired: desire() after it starts a replica,
 * release() before it stops one, so that its own stops are never taken for crashes.
 */
import type { Logger } from "@platform/logger";
import type { ExitInfo, ReplicaSpec, ReplicaState, RuntimeDriver } from "./runtime/types.ts";
import { errorText } from "./error-text.ts";

const BACKOFF_MIN_MS = 1_000;
const BACKOFF_MAX_MS = 30_000;
/** A run this long counts as healthy: the next crash is restarted after the shortest wait again. */
const STABLE_RUN_MS = 60_000;
/** Crashes (and failed restarts) in a row, no run lasting STABLE_RUN_MS between them, that make a crash loop. */
export const CRASH_LOOP_CRASHES = 3;
/** Grace for a restarted replica that was released while it was being started. */
const STOP_GRACE_MS = 10_000;

export interface SupervisorEvent {
  replicaId: string;
  app: string;
  branch: string;
  group: string;
  service: string;
  kind: "crashed" | "restarted" | "oom_killed" | "restart_failed";
  /** The exit that started this round of restarts. */
  exit: ExitInfo | null;
  message: string;
}

/** A replica began crash-looping (`looping`), or stopped: it ran STABLE_RUN_MS, or was released. */
export interface CrashLoopEvent {
  spec: ReplicaSpec;
  looping: boolean;
  /** Crashes and failed restarts in a row so far. */
  crashes: number;
  /** The last crash. */
  exit: ExitInfo | null;
}

export interface SupervisorOptions {
  driver: RuntimeDriver;
  onEvent: (event: SupervisorEvent) => void;
  onCrashLoop?: (event: CrashLoopEvent) => void;
  /** How long a run must last to count as stable (default STABLE_RUN_MS). */
  stableRunMs?: number;
  /**
   * Where a crashed replica comes back (another port, say): asked when the crash is seen
   * (`crashed`) and again just before each restart (`restart`). Absent: where it was.
   */
  relocate?: (spec: ReplicaSpec, when: "crashed" | "restart") => Promise<ReplicaSpec>;
  logger?: Logger;
}

interface Desired {
  spec: ReplicaSpec;
  /** Crashes and failed restarts since the last stable run: the exponent of the backoff. */
  failures: number;
  timer: NodeJS.Timeout | null;
  /**
   * The start time of the run whose exit desire() found and handled: the driver's report of that
   * same exit may come after the restart has begun, and is not a second crash.
   */
  handledRun: number | null;
  /** The relocation asked for at the crash, which the restart waits for. */
  relocating: Promise<void> | null;
  /** Said to be crash-looping (onCrashLoop), and not yet said to have stopped. */
  looping: boolean;
  /** Ends the crash loop once a restarted run has lasted STABLE_RUN_MS. */
  steady: NodeJS.Timeout | null;
  lastExit: ExitInfo | null;
}

/** How a replica ended, as its log lines and error messages say it. */
export function describeExit(exit: ExitInfo | null): string {
  if (!exit) return "exited";
  if (exit.oomKilled) return "was killed for exceeding its memory limit";
  if (exit.signal) return `was killed by ${exit.signal}`;
  if (exit.code !== null) return `exited with code ${exit.code}`;
  // Not "exited" alone, which reads as a clean exit: only a process's parent learns its status,
  // and a replica adopted after an agent restart is not the agent's child (nor is a container
  // Docker no longer knows).
  return "exited (exit status unknown)";
}

export class Supervisor {
  readonly #driver: RuntimeDriver;
  readonly #onEvent: (event: SupervisorEvent) => void;
  readonly #onCrashLoop: SupervisorOptions["onCrashLoop"];
  readonly #stableRunMs: number;
  readonly #relocate: SupervisorOptions["relocate"];
  readonly #logger: Logger | undefined;
  readonly #desired = new Map<string, Desired>();
  #closed = false;

  constructor(opts: SupervisorOptions) {
    this.#driver = opts.driver;
    this.#onEvent = opts.onEvent;
    this.#onCrashLoop = opts.onCrashLoop;
    this.#stableRunMs = opts.stableRunMs ?? STABLE_RUN_MS;
    this.#relocate = opts.relocate;
    this.#logger = opts.logger;
    opts.driver.onExit((state) => this.#exited(state));
  }

  /**
   * Keeps the replica running from now on. One that already exited (between its health check
   * and the swap, or while the agent was down) is started again at once, as a crash would be.
   */
  desire(spec: ReplicaSpec): void {
    const previous = this.#desired.get(spec.id);
    if (previous) this.#forget(previous);
    const entry: Desired = { spec, failures: 0, timer: null, handledRun: null, relocating: null, looping: false, steady: null, lastExit: null };
    this.#desired.set(spec.id, entry);
    const state = this.#driver.list().find((r) => r.spec.id === spec.id);
    if (state && !state.running && !this.#closed) {
      entry.handledRun = state.startedAt.getTime();
      this.#emit(spec, state.exit?.oomKilled ? "oom_killed" : "crashed", state.exit, `Replica ${spec.id} ${describeExit(state.exit)}; restarting now.`);
      this.#schedule(entry, 0, state.exit);
    }
  }

  release(replicaId: string): void {
    const entry = this.#desired.get(replicaId);
    if (entry) this.#forget(entry);
    this.#desired.delete(replicaId);
  }

  /** An entry no longer kept: its timers stop, and a crash loop it was in ends. */
  #forget(entry: Desired): void {
    if (entry.timer) clearTimeout(entry.timer);
    if (entry.steady) clearTimeout(entry.steady);
    entry.timer = entry.steady = null;
    if (entry.looping) this.#loop(entry, false);
  }

  desired(): ReplicaSpec[] {
    return [...this.#desired.values()].map((d) => d.spec);
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const entry of this.#desired.values()) {
      if (entry.timer) clearTimeout(entry.timer);
      if (entry.steady) clearTimeout(entry.steady);
    }
  }

  #current(entry: Desired): boolean {
    return !this.#closed && this.#desired.get(entry.spec.id) === entry;
  }

  #exited(state: ReplicaState): void {
    const entry = this.#desired.get(state.spec.id);
    // A restart already scheduled or begun (desire() saw the exit first) covers this exit too.
    if (!entry || this.#closed || entry.timer || entry.handledRun === state.startedAt.getTime()) return;
    const ranMs = (state.exit?.at ?? new Date()).getTime() - state.startedAt.getTime();
    if (ranMs >= this.#stableRunMs) entry.failures = 0;
    if (entry.steady) clearTimeout(entry.steady);
    entry.steady = null;
    entry.lastExit = state.exit;
    const delay = this.#retryIn(entry);
    this.#emit(entry.spec, state.exit?.oomKilled ? "oom_killed" : "crashed", state.exit, `Replica ${state.spec.id} ${describeExit(state.exit)}; restarting in ${delay / 1000} s.`);
    this.#schedule(entry, delay, state.exit);
    const relocate = this.#relocate;
    if (!relocate) return;
    entry.relocating = relocate(entry.spec, "crashed")
      .then((spec) => {
        if (this.#current(entry)) entry.spec = spec;
      })
      .catch((err: unknown) => this.#logger?.warn({ err, replica: entry.spec.id }, "a crashed replica could not be given another port; it restarts on its own"))
      .finally(() => (entry.relocating = null));
  }

  #retryIn(entry: Desired): number {
    const delay = Math.min(BACKOFF_MIN_MS * 2 ** entry.failures, BACKOFF_MAX_MS);
    entry.failures++;
    if (entry.failures >= CRASH_LOOP_CRASHES && !entry.looping) this.#loop(entry, true);
    return delay;
  }

  #loop(entry: Desired, looping: boolean): void {
    entry.looping = looping;
    try {
      this.#onCrashLoop?.({ spec: entry.spec, looping, crashes: entry.failures, exit: entry.lastExit });
    } catch (err) {
      this.#logger?.error({ err, replica: entry.spec.id }, "crash loop handler failed");
    }
  }

  #schedule(entry: Desired, delay: number, exit: ExitInfo | null): void {
    entry.timer = setTimeout(() => void this.#restart(entry, exit), delay);
    entry.timer.unref();
  }

  async #restart(entry: Desired, exit: ExitInfo | null): Promise<void> {
    entry.timer = null;
    if (!this.#current(entry)) return;
    await entry.relocating;
    let { spec } = entry;
    // Started meanwhile (by whoever saw the exit first): nothing to do.
    if (this.#driver.list().some((r) => r.spec.id === spec.id && r.running)) return;
    try {
      if (this.#relocate) {
        spec = await this.#relocate(spec, "restart");
        if (!this.#current(entry)) return;
        entry.spec = spec;
      }
      await this.#driver.start(spec);
    } catch (err) {
      if (!this.#current(entry)) return;
      const delay = this.#retryIn(entry);
      const reason = errorText(err);
      this.#emit(spec, "restart_failed", exit, `Replica ${spec.id} could not be restarted: ${reason}; trying again in ${delay / 1000} s.`);
      this.#schedule(entry, delay, exit);
      return;
    }
    if (!this.#current(entry)) {
      // Released while starting: the deployer's stop may have come before this start.
      await this.#driver.stop(spec.id, STOP_GRACE_MS).catch((err: unknown) => this.#logger?.warn({ err, replica: spec.id }, "stopping a released replica failed"));
      return;
    }
    this.#emit(spec, "restarted", exit, `Replica ${spec.id} restarted (attempt ${entry.failures}).`);
    if (entry.looping) {
      entry.steady = setTimeout(() => {
        entry.steady = null;
        if (this.#current(entry) && entry.looping) this.#loop(entry, false);
      }, this.#stableRunMs);
      entry.steady.unref();
    }
  }

  #emit(spec: ReplicaSpec, kind: SupervisorEvent["kind"], exit: ExitInfo | null, message: string): void {
    try {
      this.#onEvent({ replicaId: spec.id, app: spec.app, branch: spec.branch, group: spec.group, service: spec.service, kind, exit, message });
    } catch (err) {
      this.#logger?.error({ err, replica: spec.id }, "supervisor event handler failed");
    }
  }
}
