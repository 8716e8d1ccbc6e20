/**
 * `events.deploy_queue.action_updated`: every state change of an action is announced through the
 * outbox in the transaction that makes it (apps-builds keeps builds rows in step with it).
 */
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
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
  claimed_at: string | null;
  completed_at: string | null;
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
  | "claimedAt"
  | "completedAt"
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
    result: action.result ?? null,
    app_name: action.appName,
    branch: action.branch,
    group_slug: action.groupSlug,
    claimed_at: iso(action.claimedAt),
    completed_at: iso(action.completedAt),
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
