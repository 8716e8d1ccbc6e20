/**
 * The log rate limit: how much of its output one replica, or one build, may ship to the log store.
 * A replica printing without end (a loop logging each turn, a storm of stack traces) would
 * otherwise store millions of lines in minutes, and every log search of its group would wade
 * through them until retention took them away. Each has an allowance of `perMinute` lines: a
 * minute's worth at once (a start-up dump, a package install), refilled evenly. Past it, its
 * lines are dropped and counted, and a notice in its own stream says how many, every
 * DROPPED_NOTICE_MS.
 */

/** How often a replica or a build past its limit is told, in its own stream, how many lines it lost. */
export const DROPPED_NOTICE_MS = 5_000;

/** A notice due: `dropped` lines of the stream `key` (a replica, a build), whose last dropped line came with `context`. */
export interface DroppedNotice<T> {
  key: string;
  dropped: number;
  /** When the first of them was dropped. */
  since: Date;
  context: T;
}

interface Allowance<T> {
  tokens: number;
  at: number;
  dropped: number;
  since: number;
  context: T | null;
}

/** Allowances keyed by a replica id or a build id; `T` is what a notice needs to say where it goes. */
export class LogRateLimit<T> {
  readonly #perMinute: number;
  readonly #perMs: number;
  readonly #now: () => number;
  readonly #allowances = new Map<string, Allowance<T>>();

  /** `perMinute` 0: no limit. */
  constructor(opts: { perMinute: number; now?: () => number }) {
    this.#perMinute = opts.perMinute;
    this.#perMs = opts.perMinute / 60_000;
    this.#now = opts.now ?? Date.now;
  }

  /** True when a line of stream `key` may be shipped; false when it is dropped (and counted, with `context` for its notice). */
  admit(key: string, context: T): boolean {
    if (this.#perMinute <= 0) return true;
    const now = this.#now();
    let a = this.#allowances.get(key);
    if (!a) this.#allowances.set(key, (a = { tokens: this.#perMinute, at: now, dropped: 0, since: 0, context: null }));
    this.#refill(a, now);
    if (a.tokens >= 1) {
      a.tokens -= 1;
      return true;
    }
    if (a.dropped === 0) a.since = now;
    a.dropped++;
    a.context = context;
    return false;
  }

  /**
   * What was dropped since the last call, per stream, and forgets streams whose allowance is
   * whole again (a replica or build gone, or quiet for a minute).
   */
  notices(): DroppedNotice<T>[] {
    const now = this.#now();
    const due: DroppedNotice<T>[] = [];
    for (const [key, a] of this.#allowances) {
      if (a.dropped > 0 && a.context !== null) {
        due.push({ key, dropped: a.dropped, since: new Date(a.since), context: a.context });
        a.dropped = 0;
        a.context = null;
        continue;
      }
      this.#refill(a, now);
      if (a.tokens >= this.#perMinute) this.#allowances.delete(key);
    }
    return due;
  }

  #refill(a: Allowance<T>, now: number): void {
    a.tokens = Math.min(this.#perMinute, a.tokens + (now - a.at) * this.#perMs);
    a.at = now;
  }
}
