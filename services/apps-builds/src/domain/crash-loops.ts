/**
 * Crash loops: an agent tells (`service_crash_loop`) when a replica has crashed again and again
 * with no run of a minute between (the supervisor's CRASH_LOOP_CRASHES), and when that ended.
 * The deploy that started it had passed its health checks, so `deploy_status` stays running;
 * the app's `warnings` say which service keeps crashing, as long as its release serves. A loop
 * of a release no longer serving is left unsaid, and forgotten at the next tell for the branch.
 */
import type { EntityManager } from "@platform/db";
import { eventText } from "@platform/bus";
import { App } from "../entities/index.ts";

export interface CrashLoop {
  service: string;
  tag: string;
  crashes: number;
  last_exit: string;
  since: string;
}

export interface CrashLoopTold extends CrashLoop {
  groupSlug: string;
  appName: string;
  branch: string;
  replica: string;
  looping: boolean;
}

export function parseCrashLoop(data: Record<string, unknown>): CrashLoopTold {
  const text = (key: string) => eventText("service_crash_loop", data, key);
  if (typeof data.looping !== "boolean") throw new Error("service_crash_loop: looping must be a boolean");
  const crashes = typeof data.crashes === "number" && Number.isInteger(data.crashes) ? data.crashes : 0;
  return {
    groupSlug: text("group_slug"),
    appName: text("app_name"),
    branch: text("branch"),
    service: text("service_name"),
    tag: text("tag"),
    replica: text("replica"),
    looping: data.looping,
    crashes,
    last_exit: typeof data.last_exit === "string" ? data.last_exit : "exited",
    since: text("at"),
  };
}

export async function recordCrashLoop(em: EntityManager, e: CrashLoopTold): Promise<void> {
  const app = await em.findOne(App, { groupSlug: e.groupSlug, appName: e.appName, branch: e.branch });
  if (!app) return;
  const loops = Object.fromEntries(Object.entries(app.crashLoops).filter(([replica, loop]) => replica !== e.replica && loop.tag === app.runningVersion));
  if (e.looping) loops[e.replica] = { service: e.service, tag: e.tag, crashes: e.crashes, last_exit: e.last_exit, since: e.since };
  app.crashLoops = loops;
}

/** One warning per service of the serving release with a replica crash-looping. */
export function crashLoopWarnings(app: Pick<App, "crashLoops" | "runningVersion" | "appName" | "branch">): string[] {
  const byService = new Map<string, CrashLoop[]>();
  for (const loop of Object.values(app.crashLoops)) {
    if (loop.tag !== app.runningVersion) continue;
    byService.set(loop.service, [...(byService.get(loop.service) ?? []), loop]);
  }
  return [...byService].sort(([a], [b]) => a.localeCompare(b)).map(([service, loops]) => {
    // Told once when the loop began, not at each crash since: the warning says when, and how it began.
    const first = loops.reduce((a, b) => (a.since <= b.since ? a : b));
    return (
      `Service ${service} keeps crashing: ${loops.length} replica(s) crash-looping since ${first.since} ` +
      `(${first.crashes} crashes in a row without a minute's run; the last of them: ${first.last_exit}). ` +
      `The agent keeps restarting it; its output is in GET /api/logs?app_name=${app.appName}&source=container, the restarts in source=agent.`
    );
  });
}
