/**
 * `events.deploy_queue.action_updated`: every state change of an action is announced through the
 * outbox in the transaction that makes it (apps-builds keeps builds rows in step with it).
 */
import { enqueueEvent, type EntityManager } from "@platform/db";
import { pairSafeEnd, subjects } from "@platform/bus";
import type { Action } from "../entities/index.ts";
import { recordHistory } from "./history.ts";
import { queueStatus } from "./lifecycle.ts";

export interface ActionUpdated {
  action_id: string;
  action_type: string;
  status: string;
  queue_status: string;
  phase: string | null;
  error_message: string | null;
  result: Record<string, unknown> | null;
  app_name: string;
  branch: string;
  group_slug: string;
  /** When the action was queued: apps-builds leaves alone the branch registered again after it. */
  created_at: string | null;
  claimed_at: string | null;
  completed_at: string | null;
  /** When the route moved to the new release (the point of no return): it serves from then on. */
  swap_committed_at: string | null;
  // Beyond the contract apps-builds reads: what a live view of the queue needs.
  claimed_by: string | null;
  depends_on: string | null;
  cancel_requested: boolean;
  admission_check_reason: string | null;
  updated_at: string;
  image_tag: string | null;
  /** The build a DEPLOY ships (running_build_id); null when unattributable. */
  build_id: string | null;
}

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : null);

/**
 * What apps-builds reads of a result (builds rows, last_crash_output, purge, the live mounts). The rest (per-phase
 * output, env_vars_snapshot) stays in the queue row: an event has to fit in one bus message.
 */
const ANNOUNCED_RESULT_KEYS = ["commit_hash", "commit_message", "commit_author", "commit_committed_at", "images", "config", "log", "crash_output", "purge", "mounts"];

/** Well under the bus's message size (1 MiB unless configured), leaving room for the rest of the event. */
export const ANNOUNCED_RESULT_MAX_BYTES = 512 * 1024;

/** A string no longer worth cutting: what is left over the bound is not in long texts. */
const SHORTEST_CUT = 256;
/** The note a cut text ends with. */
const CUT_NOTE = /\n\[cut: (\d+) more characters\]$/;
/** Room for the note a cut text ends with. */
const CUT_NOTE_ROOM = 64;

/** How many bytes `value` takes as JSON beyond ANNOUNCED_RESULT_MAX_BYTES (0 or less: it fits). */
const overBound = (value: unknown) => Buffer.byteLength(JSON.stringify(value)) - ANNOUNCED_RESULT_MAX_BYTES;

/**
 * The announced part of a result, cut to ANNOUNCED_RESULT_MAX_BYTES: the longest text (a build
 * log of up to 1 MiB, a crash line, a commit message) loses its end, at most half of it at a time,
 * with a note of what was cut, until the whole fits.
 */
export function announcedResult(result: Record<string, unknown> | null): Record<string, unknown> | null {
  if (!result) return null;
  const picked: Record<string, unknown> = structuredClone(Object.fromEntries(ANNOUNCED_RESULT_KEYS.filter((k) => k in result).map((k) => [k, result[k]])));
  for (let excess = overBound(picked); excess > 0; excess = overBound(picked)) {
    const longest = longestString(picked);
    if (!longest || longest.text.length < SHORTEST_CUT) break;
    // What is over the bound (each character is at least a byte), but at most half of it at once.
    // A text cut before ends with that cut's note: the new note counts what both cut.
    const earlier = CUT_NOTE.exec(longest.text);
    const text = earlier ? longest.text.slice(0, earlier.index) : longest.text;
    const keep = pairSafeEnd(text, Math.max(Math.floor(text.length / 2), text.length - excess - CUT_NOTE_ROOM));
    longest.holder[longest.key] = `${text.slice(0, keep)}\n[cut: ${text.length - keep + Number(earlier?.[1] ?? 0)} more characters]`;
  }
  return picked;
}

/** The longest string anywhere in `value`, with the object (or array) and key holding it. */
function longestString(value: Record<string, unknown>): { holder: Record<string, unknown>; key: string; text: string } | null {
  let best: { holder: Record<string, unknown>; key: string; text: string } | null = null;
  const visit = (holder: Record<string, unknown>) => {
    for (const [key, v] of Object.entries(holder)) {
      if (typeof v === "string") {
        if (!best || v.length > best.text.length) best = { holder, key, text: v };
      } else if (v && typeof v === "object") visit(v as Record<string, unknown>);
    }
  };
  visit(value);
  return best;
}

/** What an announcement reads of an action: an entity, or a row written with SQL of its own. */
export type AnnouncedAction = Pick<
  Action,
  | "id"
  | "actionType"
  | "status"
  | "phase"
  | "errorMessage"
  | "result"
  | "appName"
  | "branch"
  | "groupSlug"
  | "createdAt"
  | "claimedAt"
  | "completedAt"
  | "swapCommittedAt"
  | "claimedBy"
  | "dependsOn"
  | "cancelRequested"
  | "admissionCheckReason"
  | "imageTag"
  | "payload"
>;

export function actionUpdated(action: AnnouncedAction, now: Date): ActionUpdated {
  return {
    action_id: action.id,
    action_type: action.actionType,
    status: action.status,
    queue_status: queueStatus(action),
    phase: action.phase ?? null,
    error_message: action.errorMessage ?? null,
    result: announcedResult(action.result ?? null),
    app_name: action.appName,
    branch: action.branch,
    group_slug: action.groupSlug,
    created_at: iso(action.createdAt),
    claimed_at: iso(action.claimedAt),
    completed_at: iso(action.completedAt),
    swap_committed_at: iso(action.swapCommittedAt),
    claimed_by: action.claimedBy ?? null,
    depends_on: action.dependsOn ?? null,
    cancel_requested: action.cancelRequested,
    admission_check_reason: action.admissionCheckReason ?? null,
    updated_at: now.toISOString(),
    image_tag: action.imageTag ?? null,
    build_id: typeof action.payload?.build_id === "string" ? action.payload.build_id : null,
  };
}

export function announce(em: EntityManager, action: Action, now: Date): void {
  recordHistory(em, action, now);
  enqueueEvent(em, subjects.events.actionUpdated, { ...actionUpdated(action, now) });
}
