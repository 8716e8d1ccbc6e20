/**
 * Phase reports of an action (agent/src/work.ts): sent in order without holding the work up, a
 * cancel honoured at the next phase boundary after the queue said it, the point of no return
 * waiting for its own answer, and a failed report failing only a waited-for phase.
 */
import { describe, expect, it } from "vitest";
import { phaseReports } from "../src/work.ts";

/** A queue whose answers the test releases one by one. */
function fakeQueue() {
  const sent: string[] = [];
  const pending: Array<{ name: string; answer(cancel: boolean): void; fail(err: Error): void }> = [];
  const report = (name: string) =>
    new Promise<boolean>((resolve, reject) => {
      sent.push(name);
      pending.push({ name, answer: resolve, fail: reject });
    });
  const next = async () => {
    await expect.poll(() => pending.length).toBeGreaterThan(0);
    return pending.shift()!;
  };
  return { sent, report, next };
}

describe("phase reports", () => {
  it("enters phases without waiting for the queue, and sends the reports one after another in order", async () => {
    const q = fakeQueue();
    const r = phaseReports(q.report);
    expect(await r.enter("clone")).toBe(false);
    expect(await r.enter("config")).toBe(false);
    expect(await r.enter("build:web")).toBe(false);
    // Only the first is on its way: the next goes once the queue has answered it.
    expect(q.sent).toEqual(["clone"]);
    (await q.next()).answer(false);
    (await q.next()).answer(false);
    (await q.next()).answer(false);
    await r.settled();
    expect(q.sent).toEqual(["clone", "config", "build:web"]);
  });

  it("says cancel at the first phase after the queue answered it, and reports no phase after that", async () => {
    const q = fakeQueue();
    const r = phaseReports(q.report);
    await r.enter("start");
    (await q.next()).answer(true);
    await expect.poll(() => r.enter("health_check")).toBe(true);
    expect(await r.enter("ready")).toBe(true);
    await r.settled();
    expect(q.sent).toEqual(["start"]);
  });

  it("waits at the point of no return for the answer to its own report", async () => {
    const q = fakeQueue();
    const r = phaseReports(q.report);
    await r.enter("ready");
    let committed: boolean | undefined;
    const swap = r.enter("swap_committed", { wait: true }).then((c) => (committed = c));
    (await q.next()).answer(false);
    const own = await q.next();
    expect(own.name).toBe("swap_committed");
    expect(committed).toBeUndefined();
    own.answer(true);
    await swap;
    expect(committed).toBe(true);
  });

  it("goes on past a failed report; a waited-for report that fails fails the caller", async () => {
    const q = fakeQueue();
    const r = phaseReports(q.report);
    await r.enter("setup");
    (await q.next()).fail(new Error("queue unreachable"));
    expect(await r.enter("start")).toBe(false);
    (await q.next()).answer(false);
    const swap = r.enter("swap_committed", { wait: true });
    (await q.next()).fail(new Error("queue unreachable"));
    await expect(swap).rejects.toThrow("queue unreachable");
    await r.settled();
    expect(q.sent).toEqual(["setup", "start", "swap_committed"]);
  });
});
