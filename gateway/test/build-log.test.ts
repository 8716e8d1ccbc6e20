import { describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { ActionSchema, BuildSchema, LogRowSchema } from "@platform/proto";
import { fromBuild, fromQueue, isRunning, showsShippedLines } from "../src/domain/build-log.ts";

const running = create(BuildSchema, { id: "b1", appName: "web", tag: "main-1", status: "queued", queueStatus: "build_in_progress" });
const row = (id: number, message: string) => create(LogRowSchema, { id: BigInt(id), message, serviceName: "web" });

describe("build log", () => {
  it("returns the stored log of a finished build", () => {
    const done = create(BuildSchema, { ...running, status: "completed", queueStatus: "build_completed", log: "a\nb" });
    expect(showsShippedLines(done)).toBe(false);
    expect(fromBuild(done, null)).toMatchObject({ status: "completed", log: "a\nb", lines: 2, message: null });
  });

  it("shows a build failed without a stored log (its agent stopped answering) with its error and the lines its agent shipped", () => {
    const reaped = create(BuildSchema, { ...running, status: "failed", queueStatus: "build_failed", errorMessage: "The agent on host h1 stopped responding." });
    expect(showsShippedLines(reaped)).toBe(true);
    expect(fromBuild(reaped, { rows: [row(2, "compiling"), row(1, "$ npm run build")], more: false })).toMatchObject({
      status: "failed",
      log: "[web] $ npm run build\n[web] compiling",
      lines: 2,
      message: "The agent on host h1 stopped responding. This build stored no log: these are the lines its agent shipped.",
    });
    expect(fromBuild(reaped, { rows: [], more: false })).toMatchObject({ log: "", lines: 0, message: "The agent on host h1 stopped responding. This build stored no output." });
    expect(fromBuild(reaped, null).message).toBe("The agent on host h1 stopped responding. This build stored no output.");
  });

  it("streams the live tail oldest first while the build runs, flagging truncation", () => {
    const r = fromBuild(running, { rows: [row(2, "second"), row(1, "first")], more: true });
    expect(r.log).toBe("[web] first\n[web] second");
    expect(r.lines).toBe(2);
    expect(r.message).toMatch(/^In-progress stream: the build is in progress; .*truncated/);
    expect(r.status).toBe("queued");
    expect(r).not.toHaveProperty("source");
  });

  it("pulls no tail before an agent has started the build, and says so", () => {
    const queued = create(BuildSchema, { ...running, queueStatus: "queued" });
    expect(isRunning(queued)).toBe(false);
    expect(showsShippedLines(queued)).toBe(false);
    expect(fromBuild(queued, null)).toMatchObject({ status: "queued", queue_status: "queued", log: "", lines: 0, message: expect.stringContaining("no agent has started it yet") });
    // Finished in the queue, its row not yet finalised: the stored log is on its way.
    const finishing = create(BuildSchema, { ...running, queueStatus: "build_completed" });
    expect(isRunning(finishing)).toBe(false);
    expect(fromBuild(finishing, null).message).toBe("The build is completed and its log is being stored; try again in a moment.");
    expect(isRunning(running)).toBe(true);
    expect(showsShippedLines(running)).toBe(true);
  });

  it("degrades to a retry message when the live read fails", () => {
    expect(fromBuild(running, null)).toMatchObject({ log: "", lines: 0, message: expect.stringContaining("try again") });
  });

  it("synthesises from the queue action with per-phase output and source queue", () => {
    const action = create(ActionSchema, {
      actionId: "a1",
      appName: "web",
      status: "failed",
      queueStatus: "build_failed",
      errorMessage: "Clone failed: no such repository",
      resultJson: JSON.stringify({ phases: { clone: "Cloning main" } }),
    });
    expect(fromQueue(action)).toEqual({
      build_id: "a1",
      app_name: "web",
      tag: "",
      status: "failed",
      queue_status: "build_failed",
      message: "Clone failed: no such repository",
      log: "== clone\nCloning main",
      lines: 2,
      source: "queue",
    });
    // Phases in the order they ran, whatever order the stored JSON keeps them in.
    const ran = create(ActionSchema, {
      actionId: "a3",
      appName: "web",
      status: "cancelled",
      resultJson: JSON.stringify({ phases: { clone: "c", config: "f", package: "p", "build:web": "b" } }),
    });
    expect(fromQueue(ran).log).toBe("== clone\nc\n== config\nf\n== build:web\nb\n== package\np");
    const waiting = create(ActionSchema, { actionId: "a2", appName: "web", status: "queued" });
    expect(fromQueue(waiting).message).toContain("/api/deployments/queue/a2/diagnose");
  });
});
