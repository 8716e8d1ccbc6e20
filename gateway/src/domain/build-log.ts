/**
 * The build log response (spec doc 1 sections 2.3 and 4.3 "Build logs behaviour"), composed
 * from three reads: the builds row's stored log; while the build runs, a live tail of the lines
 * the agent shipped; and, when no builds row exists, the queue action (`source: queue`).
 */
import type { Action, Build, LogRow } from "@platform/proto";

export interface BuildLogResponse {
  build_id: string;
  app_name: string;
  tag: string;
  status: string;
  queue_status: string | null;
  message: string | null;
  log: string;
  lines: number;
  source?: "queue";
}

/** How many shipped lines a live tail (a build's, a deployment's phases) is read from. */
export const LIVE_TAIL_LIMIT = 1000;
/** The statuses an action (a build, a deployment) ends in. */
export const TERMINAL: ReadonlySet<string> = new Set(["completed", "failed", "cancelled"]);

function countLines(log: string): number {
  if (!log) return 0;
  return log.endsWith("\n") ? log.split("\n").length - 1 : log.split("\n").length;
}

/** A shipped line as the agent words it in a stored log: `[service] message`. */
export function lineText(row: LogRow): string {
  return row.serviceName ? `[${row.serviceName}] ${row.message}` : row.message;
}

/**
 * The queue says the build runs (spec 4.3): only then is a live tail pulled. The builds row keeps
 * `queued` for the whole run; its `queue_status` follows the action.
 */
export function isRunning(build: Build): boolean {
  return !TERMINAL.has(build.status) && build.queueStatus === "build_in_progress";
}

/**
 * Whether the answer shows the lines the agent shipped, read from the log store: while the build
 * runs (its live tail), and when it finished without a stored log.
 */
export function showsShippedLines(build: Build): boolean {
  return !build.log && (isRunning(build) || TERMINAL.has(build.status));
}

/** A live queue status in words: `build_in_progress` is "in progress". */
function liveState(queueStatus: string): string {
  return queueStatus.replace(/^build_/, "").replaceAll("_", " ");
}

/** The shipped lines of a build, oldest first (the log store answers newest first). */
function shippedLog(tail: { rows: LogRow[] }): string {
  return tail.rows.map(lineText).reverse().join("\n");
}

/**
 * A finished build's stored log, or the live tail while it runs (`tail` null: the read failed);
 * a build not started yet, or finished but not yet stored, has none. A build that finished with
 * no stored log (its agent stopped answering and the queue failed it) shows the lines its agent
 * shipped, when there are any, after its error.
 */
export function fromBuild(build: Build, tail: { rows: LogRow[]; more: boolean } | null): BuildLogResponse {
  const base = { build_id: build.id, app_name: build.appName, tag: build.tag, status: build.status, queue_status: build.queueStatus || null };
  if (TERMINAL.has(build.status) || build.log) {
    const stored = build.log ?? "";
    if (stored) return { ...base, message: null, log: stored, lines: countLines(stored) };
    const shipped = tail && tail.rows.length > 0 ? shippedLog(tail) : "";
    const error = build.errorMessage ? `${build.errorMessage} ` : "";
    const message = shipped
      ? `${error}This build stored no log: these are the lines its agent shipped${tail?.more ? ` (the last ${LIVE_TAIL_LIMIT})` : ""}.`
      : `${error}This build stored no output.`;
    return { ...base, message, log: shipped, lines: countLines(shipped) };
  }
  if (!isRunning(build)) {
    const message =
      !build.queueStatus || build.queueStatus === "queued"
        ? "The build is queued: no agent has started it yet, so it has no output."
        : `The build is ${liveState(build.queueStatus)} and its log is being stored; try again in a moment.`;
    return { ...base, message, log: "", lines: 0 };
  }
  if (tail === null) {
    return { ...base, message: "The build is running but its live output could not be read; try again in a moment.", log: "", lines: 0 };
  }
  const log = shippedLog(tail);
  const truncation = tail.more ? ` (truncated to the last ${LIVE_TAIL_LIMIT} lines)` : "";
  return {
    ...base,
    message: `In-progress stream: the build is ${liveState(build.queueStatus)}; this is its output so far${truncation}.`,
    log,
    lines: countLines(log),
  };
}

/** A BUILD's phases run clone, config, build:<service> (one per service), package. */
function phaseRank(phase: string): number {
  if (phase === "clone") return 0;
  if (phase === "config") return 1;
  if (phase === "package") return 3;
  return 2;
}

/** No builds row (the build failed before its record existed): synthesised from the queue action. */
export function fromQueue(action: Action): BuildLogResponse {
  let phases: Record<string, string> = {};
  try {
    const result = JSON.parse(action.resultJson || "{}") as { phases?: Record<string, string> };
    phases = result.phases ?? {};
  } catch {
    phases = {};
  }
  // In the order the agent ran them: the stored JSON keeps its keys in an order of its own.
  const log = Object.entries(phases)
    .sort(([a], [b]) => phaseRank(a) - phaseRank(b))
    .map(([phase, output]) => `== ${phase}\n${output}`)
    .join("\n");
  const message =
    action.errorMessage ||
    (TERMINAL.has(action.status) ? null : `The action is ${action.status}; run GET /api/deployments/queue/${action.actionId}/diagnose to see why.`);
  const tag = action.imageTag ?? "";
  return {
    build_id: action.actionId,
    app_name: action.appName,
    tag,
    status: action.status,
    queue_status: action.queueStatus || null,
    message: message ?? null,
    log,
    lines: countLines(log),
    source: "queue",
  };
}
