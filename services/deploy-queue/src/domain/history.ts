/**
 * Deployment history (spec doc 1 section 2.4): one immutable record per DEPLOY, RETRY or
 * UNDEPLOY, written in the transaction that makes the action terminal (see events.ts: every
 * terminal transition is announced exactly once). `env_vars_snapshot` is what the agent ran the
 * release with; a deployment that never ran has an empty one.
 */
import type { EntityManager } from "@platform/db";
import { HistoryRecord, type Action } from "../entities/index.ts";
import { isTerminal } from "./lifecycle.ts";

export const DEPLOYMENT_TYPES = ["DEPLOY", "RETRY", "UNDEPLOY"] as const;
const DEPLOYMENT_TYPE_SET = new Set<string>(DEPLOYMENT_TYPES);

export function isDeploymentType(actionType: string): boolean {
  return DEPLOYMENT_TYPE_SET.has(actionType);
}

function stringMap(value: unknown): Record<string, string> {
  if (!value || typeof value !== "object" || Array.isArray(value)) return {};
  return Object.fromEntries(Object.entries(value).filter((e): e is [string, string] => typeof e[1] === "string"));
}

const text = (v: unknown) => (typeof v === "string" && v !== "" ? v : null);

export function recordHistory(em: EntityManager, action: Action, now: Date): void {
  if (!isDeploymentType(action.actionType) || !isTerminal(action.status)) return;
  const result = action.result ?? {};
  const completedAt = action.completedAt ?? now;
  em.create(HistoryRecord, {
    id: action.id,
    deploymentId: action.id,
    actionType: action.actionType,
    groupSlug: action.groupSlug,
    appName: action.appName,
    branch: action.branch,
    imageTag: action.imageTag ?? null,
    previousTag: text(result.previous_tag) ?? text(action.payload?.previous_tag),
    status: action.status,
    durationSeconds: action.claimedAt ? Math.max(0, Math.round((completedAt.getTime() - action.claimedAt.getTime()) / 1000)) : null,
    envVarsSnapshot: stringMap(result.env_vars_snapshot),
    createdBy: action.createdBy,
    startedAt: action.claimedAt ?? null,
    completedAt,
  });
}
