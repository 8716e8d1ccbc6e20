/** Crash loops as the app's warnings show them: only those of the serving release, one per service. */
import { expect, it } from "vitest";
import { crashLoopWarnings, parseCrashLoop, type CrashLoop } from "../src/domain/crash-loops.ts";

const loop = (over: Partial<CrashLoop> = {}): CrashLoop => ({ service: "web", tag: "main-1", crashes: 3, last_exit: "exited with code 7", since: "2026-11-25T10:00:00.000Z", ...over });
const app = (crashLoops: Record<string, CrashLoop>, runningVersion: string | null = "main-1") => ({ crashLoops, runningVersion, appName: "shop", branch: "main" });

it("warns once per service of the serving release, from when its loop began, and says nothing of another release's", () => {
  const warnings = crashLoopWarnings(
    app({
      r1: loop(),
      r2: loop({ crashes: 5, last_exit: "was killed by SIGKILL", since: "2026-11-25T10:05:00.000Z" }),
      r3: loop({ service: "api", tag: "main-0" }),
      r4: loop({ service: "worker" }),
    }),
  );
  expect(warnings).toEqual([
    "Service web keeps crashing: 2 replica(s) crash-looping since 2026-11-25T10:00:00.000Z (3 crashes in a row without a minute's run; the last of them: exited with code 7). " +
      "The agent keeps restarting it; its output is in GET /api/logs?app_name=shop&source=container, the restarts in source=agent.",
    expect.stringMatching(/^Service worker keeps crashing: 1 replica\(s\) crash-looping since /),
  ]);
  expect(crashLoopWarnings(app({ r1: loop() }, null))).toEqual([]);
});

it("refuses a told crash loop without the fields it needs", () => {
  const told = { group_slug: "acme", app_name: "shop", branch: "main", service_name: "web", tag: "main-1", replica: "r1", looping: true, crashes: 3, last_exit: "exited with code 7", at: "2026-11-25T10:00:00.000Z" };
  expect(parseCrashLoop(told)).toMatchObject({ groupSlug: "acme", replica: "r1", looping: true, since: told.at });
  expect(() => parseCrashLoop({ ...told, looping: "yes" })).toThrow(/looping/);
  expect(() => parseCrashLoop({ ...told, replica: "" })).toThrow(/replica/);
});
