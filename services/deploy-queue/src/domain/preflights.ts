/**
 * GIT_PREFLIGHT rows (spec doc 1 section 2.5). A preflight is a fast request to any agent that
 * apps-builds makes, never in the deploy lane (ARCHITECTURE section 4): no agent claims it and no
 * admission gate holds it. The queue still records it, so the preflight_action_id that register,
 * save-config and recheck answer is an action like any other (queue/{id}, diagnose, the queue
 * list). Its row is written from `preflight_requested` and ended from `preflight_checked`; the
 * two come through different consumers, so either may arrive first.
 */
import type { EntityManager } from "@platform/db";
import { isUuid } from "@platform/bus";
import { Action } from "../entities/index.ts";
import { currentSlugs } from "./groups.ts";
import { isTerminal } from "./lifecycle.ts";

export interface PreflightRequested {
  actionId: string;
  appName: string;
  branch: string;
  groupSlug: string;
  requestedBy: string;
  requestedAt: Date;
}

export interface PreflightChecked extends PreflightRequested {
  status: "completed" | "cancelled";
  preflightStatus: string | null;
  message: string;
  checkedAt: Date;
}

function text(data: Record<string, unknown>, key: string): string {
  const v = data[key];
  if (typeof v !== "string" || !v) throw new Error(`preflight event without ${key}`);
  return v;
}

function time(data: Record<string, unknown>, key: string): Date {
  const d = new Date(text(data, key));
  if (Number.isNaN(d.getTime())) throw new Error(`preflight event with a malformed ${key}`);
  return d;
}

export function parsePreflightRequested(data: Record<string, unknown>): PreflightRequested {
  const actionId = text(data, "action_id");
  if (!isUuid(actionId)) throw new Error("preflight event whose action_id is not a uuid");
  return {
    actionId,
    appName: text(data, "app_name"),
    branch: text(data, "branch"),
    groupSlug: text(data, "group_slug"),
    requestedBy: typeof data.requested_by === "string" && data.requested_by ? data.requested_by : "platform",
    requestedAt: time(data, "requested_at"),
  };
}

export function parsePreflightChecked(data: Record<string, unknown>): PreflightChecked {
  const status = data.status;
  if (status !== "completed" && status !== "cancelled") throw new Error("preflight_checked event without a completed or cancelled status");
  return {
    ...parsePreflightRequested(data),
    status,
    preflightStatus: typeof data.preflight_status === "string" ? data.preflight_status : null,
    message: typeof data.message === "string" ? data.message : "",
    checkedAt: time(data, "checked_at"),
  };
}

/** The row of a preflight, queued as asked; one the queue already has (ended first) stays as it is. */
function newRow(em: EntityManager, p: PreflightRequested, groupSlug: string, now: Date): Action {
  const createdAt = p.requestedAt < now ? p.requestedAt : now;
  return em.create(Action, {
    id: p.actionId,
    actionType: "GIT_PREFLIGHT",
    status: "queued",
    groupSlug,
    appName: p.appName,
    branch: p.branch,
    deployWarnings: [],
    payload: { app_name: p.appName, branch: p.branch, group_slug: groupSlug },
    createdBy: p.requestedBy,
    createdAt,
    updatedAt: now,
  });
}

export async function recordPreflightRequests(em: EntityManager, requests: PreflightRequested[], now: Date): Promise<void> {
  const known = new Set((await em.find(Action, { id: { $in: requests.map((r) => r.actionId) } }, { fields: ["id"] })).map((a) => a.id));
  const renamed = await currentSlugs(em, requests.map((r) => r.groupSlug));
  for (const r of requests) {
    if (known.has(r.actionId)) continue;
    known.add(r.actionId);
    newRow(em, r, renamed.get(r.groupSlug) ?? r.groupSlug, now);
  }
}

export async function recordPreflightChecks(em: EntityManager, checks: PreflightChecked[], now: Date): Promise<void> {
  const rows = new Map((await em.find(Action, { id: { $in: checks.map((c) => c.actionId) } })).map((a) => [a.id, a]));
  const renamed = await currentSlugs(em, checks.map((c) => c.groupSlug));
  for (const c of checks) {
    let row = rows.get(c.actionId);
    if (!row) {
      row = newRow(em, c, renamed.get(c.groupSlug) ?? c.groupSlug, now);
      rows.set(c.actionId, row);
    }
    if (isTerminal(row.status)) continue;
    row.status = c.status;
    row.completedAt = c.checkedAt < now ? c.checkedAt : now;
    row.result = { preflight_status: c.preflightStatus, message: c.message };
    row.errorMessage = c.status === "cancelled" ? c.message : null;
  }
}
