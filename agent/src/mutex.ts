/**
 * One critical section at a time, in the order they asked. Not reentrant: a section that asks
 * for the same mutex again waits for itself.
 */
export class Mutex {
  #tail: Promise<unknown> = Promise.resolve();

  run<T>(section: () => Promise<T>): Promise<T> {
    const done = this.#tail.then(section);
    // A section that failed fails its own caller only; the next one runs all the same.
    this.#tail = done.catch(() => undefined);
    return done;
  }
}
