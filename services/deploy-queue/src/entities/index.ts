import { defineEntity, p } from "@mikro-orm/core";

/**
 * A queue action (spec doc 1 section 2.5): the authority on work state. Every field of the 2.5
 * record is a column; the rest is what placement, admission, agents and operators need.
 */
export const ActionSchema = defineEntity({
  name: "Action",
  tableName: "actions",
  properties: {
    /** action_id; a BUILD's id is its build id. */
    id: p.uuid().primary(),
    actionType: p.text(),
    /** queued, in_progress, completed, failed, cancelled. */
    status: p.text(),
    groupSlug: p.text(),
    appName: p.text(),
    branch: p.text(),
    imageTag: p.text().nullable(),
    commitMessage: p.text().nullable(),
    commitAuthor: p.text().nullable(),
    /** The action this one waits for (a DEPLOY queued with its BUILD points at the BUILD). */
    dependsOn: p.uuid().nullable(),
    autoDeploy: p.boolean().default(false),
    /** Why the agent last refused to claim; cleared on a successful claim. */
    admissionCheckReason: p.text().nullable(),
    lastAdmissionCheckAt: p.datetime().nullable(),
    /** Non-default decisions the agent applied. */
    deployWarnings: p.json<string[]>(),
    /** SERVICE_ACTION rows only. */
    serviceName: p.text().nullable(),
    /** SERVICE_ACTION rows only: restart, stop or start. */
    action: p.text().nullable(),
    /** The work description the agent runs (repository, tag, build_id...). */
    payload: p.json<Record<string, unknown>>(),
    /** What the agent reported at completion. */
    result: p.json<Record<string, unknown>>().nullable(),
    phase: p.text().nullable(),
    errorMessage: p.text().nullable(),
    /** Host that claimed it (in_progress and after). */
    claimedBy: p.text().nullable(),
    claimedAt: p.datetime().nullable(),
    /** Last claim or progress report of the claiming agent (stuck_class `in_progress`). */
    progressAt: p.datetime().nullable(),
    completedAt: p.datetime().nullable(),
    /** Higher goes first when a per-host gate has fewer free slots than waiting actions. */
    priority: p.integer().default(0),
    cancelRequested: p.boolean().default(false),
    cancelReason: p.text().nullable(),
    /** When the agent passed the blue/green swap commit: cancel is refused from then on. */
    swapCommittedAt: p.datetime().nullable(),
    /** A single-use admission override (admit-force) valid until this time. */
    admitForceUntil: p.datetime().nullable(),
    admitForceReason: p.text().nullable(),
    admitForceBy: p.text().nullable(),
    admitForceUsed: p.boolean().default(false),
    /** Work subject host the action was last dispatched to; null means `work.any`. */
    dispatchedTo: p.text().nullable(),
    dispatchedAt: p.datetime().nullable(),
    /** Dispatches after the first (re-placement away from a silent host). */
    retryCount: p.integer().default(0),
    createdBy: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
    updatedAt: p.datetime().defaultRaw("now()").onUpdate(() => new Date()),
  },
});
export class Action extends ActionSchema.class {}
ActionSchema.setClass(Action);

/** An agent as its heartbeats describe it; live = heard from in the last 60 s. */
export const AgentSchema = defineEntity({
  name: "Agent",
  tableName: "agents",
  properties: {
    hostId: p.text().primary(),
    lastSeen: p.datetime(),
    firstSeen: p.datetime().defaultRaw("now()"),
    facts: p.json<Record<string, unknown>>(),
    version: p.text(),
    schedulable: p.boolean().default(true),
  },
});
export class Agent extends AgentSchema.class {}
AgentSchema.setClass(Agent);

/** A finished deployment (spec doc 1 section 2.4): immutable once written. */
export const HistoryRecordSchema = defineEntity({
  name: "HistoryRecord",
  tableName: "deployment_history",
  properties: {
    id: p.uuid().primary(),
    deploymentId: p.uuid().unique(),
    actionType: p.text(),
    groupSlug: p.text(),
    appName: p.text(),
    branch: p.text(),
    imageTag: p.text().nullable(),
    previousTag: p.text().nullable(),
    status: p.text(),
    durationSeconds: p.integer().nullable(),
    envVarsSnapshot: p.json<Record<string, string>>(),
    createdBy: p.text(),
    startedAt: p.datetime().nullable(),
    completedAt: p.datetime(),
  },
});
export class HistoryRecord extends HistoryRecordSchema.class {}
HistoryRecordSchema.setClass(HistoryRecord);

export const entities = [ActionSchema, AgentSchema, HistoryRecordSchema];
