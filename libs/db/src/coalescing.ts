/**
 * Coalescing of one kind of write: while `maxInFlight` statements are running, the writes that
 * arrive meanwhile wait and then go together, up to `maxBatch`, in the next one. A lone write goes
 * at once, so nothing waits on a timer; under load, one round trip and one commit serve many
 * requests, which is what a statement per request spends most of its time on.
 */
export type Settled<O> = { ok: true; value: O } | { ok: false; error: unknown };

export interface CoalescerOptions {
  maxBatch: number;
  maxInFlight: number;
}

export class Coalescer<I, O> {
  readonly #run: (items: I[]) => Promise<Settled<O>[]>;
  readonly #opts: CoalescerOptions;
  #waiting: Array<{ item: I; resolve: (o: O) => void; reject: (e: unknown) => void }> = [];
  #inFlight = 0;

  /** `run` settles every item of a batch, each on its own: one item's failure is not the others'. */
  constructor(run: (items: I[]) => Promise<Settled<O>[]>, opts: CoalescerOptions) {
    this.#run = run;
    this.#opts = opts;
  }

  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.#waiting.push({ item, resolve, reject });
      this.#next();
    });
  }

  #next(): void {
    while (this.#inFlight < this.#opts.maxInFlight && this.#waiting.length > 0) {
      const batch = this.#waiting.splice(0, this.#opts.maxBatch);
      this.#inFlight++;
      this.#run(batch.map((w) => w.item))
        .then(
          (settled) =>
            batch.forEach((w, i) => {
              const s = settled[i];
              if (!s) w.reject(new Error("a coalesced write was not settled"));
              else if (s.ok) w.resolve(s.value);
              else w.reject(s.error);
            }),
          (err: unknown) => batch.forEach((w) => w.reject(err)),
        )
        .finally(() => {
          this.#inFlight--;
          this.#next();
        });
    }
  }
}
