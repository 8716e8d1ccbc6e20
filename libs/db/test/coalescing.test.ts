import { describe, expect, it } from "vitest";
import { Coalescer, type Settled } from "../src/coalescing.ts";

/** A run whose batches the test releases by hand, recording what each held. */
function gated() {
  const batches: number[][] = [];
  const gates: Array<() => void> = [];
  const run = async (items: number[]): Promise<Settled<number>[]> => {
    batches.push(items);
    await new Promise<void>((resolve) => gates.push(resolve));
    return items.map((n) => (n < 0 ? { ok: false, error: new Error(`negative ${n}`) } : { ok: true, value: n * 10 }));
  };
  return { batches, gates, run };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe("coalescing", () => {
  it("sends a lone write at once and gathers the ones that arrive while it runs", async () => {
    const g = gated();
    const c = new Coalescer(g.run, { maxBatch: 3, maxInFlight: 1 });
    const first = c.submit(1);
    await tick();
    expect(g.batches).toEqual([[1]]);
    const rest = [2, 3, 4, 5].map((n) => c.submit(n));
    await tick();
    expect(g.batches).toEqual([[1]]);
    g.gates.shift()!();
    expect(await first).toBe(10);
    await tick();
    expect(g.batches).toEqual([[1], [2, 3, 4]]);
    g.gates.shift()!();
    await tick();
    expect(g.batches).toEqual([[1], [2, 3, 4], [5]]);
    g.gates.shift()!();
    expect(await Promise.all(rest)).toEqual([20, 30, 40, 50]);
  });

  it("settles each write of a batch on its own", async () => {
    const g = gated();
    const c = new Coalescer(g.run, { maxBatch: 10, maxInFlight: 1 });
    const blocker = c.submit(0);
    const [a, b, d] = [c.submit(1), c.submit(-2), c.submit(3)];
    g.gates.shift()!();
    await blocker;
    await tick();
    g.gates.shift()!();
    expect(await a).toBe(10);
    await expect(b).rejects.toThrow("negative -2");
    expect(await d).toBe(30);
  });

  it("fails every write of a batch whose run throws, and goes on with the next", async () => {
    let calls = 0;
    const c = new Coalescer<number, number>(
      async (items) => {
        calls++;
        if (calls === 1) throw new Error("connection lost");
        return items.map((n) => ({ ok: true, value: n }));
      },
      { maxBatch: 10, maxInFlight: 2 },
    );
    await expect(c.submit(1)).rejects.toThrow("connection lost");
    expect(await c.submit(2)).toBe(2);
  });

  it("runs up to maxInFlight batches side by side", async () => {
    const g = gated();
    const c = new Coalescer(g.run, { maxBatch: 10, maxInFlight: 2 });
    const all = [1, 2, 3, 4].map((n) => c.submit(n));
    await tick();
    expect(g.batches).toEqual([[1], [2]]);
    g.gates.shift()!();
    g.gates.shift()!();
    await tick();
    await tick();
    expect(g.batches).toEqual([[1], [2], [3, 4]]);
    g.gates.shift()!();
    expect(await Promise.all(all)).toEqual([10, 20, 30, 40]);
  });
});
