/**
 * Preflight (spec doc 1 section 3.3): a new app is quarantined at `pending` until an agent has
 * tried its repository and config file. Only `ready` and `exempt` unlock build, deploy and retry.
 * Each re-queue bumps a nonce; an answer to an older request is ignored.
 */
import { randomUUID } from "node:crypto";
import type { Caller } from "@platform/caller";
import { PlatformError } from "@platform/errors";
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import type { App, PreflightResultData } from "../entities/index.ts";

export const PREFLIGHT_STATUSES = ["pending", "no_access", "needs_config", "config_invalid", "ready", "exempt"] as const;
export type PreflightStatus = (typeof PREFLIGHT_STATUSES)[number];

export interface PreflightRequest {
  /** The GIT_PREFLIGHT action's id: the queue records it (preflight_action_id of the answers). */
  action_id: string;
  app_id: string;
  nonce: number;
  repository: string;
  branch: string;
  config_path: string;
  // What the queue's row shows.
  app_name: string;
  group_slug: string;
  requested_by: string;
  requested_at: string;
}

/**
 * `preflight_checked`: how a queued preflight ended, for the queue's GIT_PREFLIGHT row. Carries
 * the request too, since the queue may hear of the end before the request.
 */
export interface PreflightChecked extends Omit<PreflightRequest, "app_id" | "nonce" | "repository" | "config_path"> {
  /** completed: an agent answered (`preflight_status`); cancelled: nothing asked any more. */
  status: "completed" | "cancelled";
  preflight_status: string | null;
  message: string;
  checked_at: string;
}

export interface PreflightAnswer {
  status: Exclude<PreflightStatus, "pending" | "exempt">;
  result: PreflightResultData | null;
  /** A valid config as authored at the branch's HEAD (status ready). */
  config?: Record<string, unknown>;
}

/**
 * `exempt` (spec 3.3) is an operator's decision, never an agent's answer: it unlocks build, deploy
 * and retry whatever the repository check says, until an operator lifts it (the app is then
 * `pending` until the next answer).
 */
export function setPreflightExemption(app: App, caller: Caller, exempt: boolean): void {
  if (!caller.platformOperator) {
    throw PlatformError.forbidden("exempt is for platform operators: a tenant's app passes the repository check to build and deploy.");
  }
  if (exempt) app.preflightStatus = "exempt";
  else if (app.preflightStatus === "exempt") app.preflightStatus = "pending";
}

/** Queues a preflight for the app (through the outbox); returns its action id. */
export function requeuePreflight(em: EntityManager, app: App, requestedBy: string): string {
  app.preflightNonce += 1;
  if (app.preflightStatus !== "exempt") app.preflightStatus = "pending";
  const request: PreflightRequest = {
    action_id: randomUUID(),
    app_id: app.id,
    nonce: app.preflightNonce,
    repository: app.repository,
    branch: app.branch,
    config_path: app.configPath,
    app_name: app.appName,
    group_slug: app.groupSlug,
    requested_by: requestedBy,
    requested_at: new Date().toISOString(),
  };
  enqueueEvent(em, subjects.events.preflightRequested, { ...request });
  return request.action_id;
}

/**
 * Announces how a preflight ended: answered (whether or not the answer was applied), or dropped
 * because the app is gone or a newer preflight replaced it.
 */
export function announcePreflightChecked(em: EntityManager, request: PreflightRequest, end: Pick<PreflightChecked, "status" | "preflight_status" | "message">): void {
  const checked: PreflightChecked = {
    action_id: request.action_id,
    branch: request.branch,
    app_name: request.app_name,
    group_slug: request.group_slug,
    requested_by: request.requested_by,
    requested_at: request.requested_at,
    ...end,
    checked_at: new Date().toISOString(),
  };
  enqueueEvent(em, subjects.events.preflightChecked, { ...checked });
}

/** Records an agent's answer, unless a newer preflight was queued meanwhile. */
export function applyPreflightAnswer(app: App, nonce: number, answer: PreflightAnswer): boolean {
  if (nonce !== app.preflightNonce || app.preflightStatus === "exempt") return false;
  app.preflightStatus = answer.status;
  app.preflightResult = answer.result;
  if (answer.status === "ready" && answer.result) app.serviceNames = answer.result.services;
  // Until a build reads it, the base layer is the config the preflight found (spec 4.4 layers).
  if (answer.status === "ready" && answer.config && !app.baseConfig) app.baseConfig = answer.config;
  return true;
}

/** What the queue's GIT_PREFLIGHT row says of an answer: the outcome, and whether it was recorded. */
export function preflightOutcome(answer: PreflightAnswer, applied: boolean, app: Pick<App, "preflightStatus"> | null): string {
  const detail = answer.result?.detail ? `: ${answer.result.detail}` : "";
  if (applied) return `The repository check answered ${answer.status}${detail}.`;
  if (app?.preflightStatus === "exempt") return `The repository check answered ${answer.status}; the app is exempt from preflight, so it stays exempt.`;
  return `The repository check answered ${answer.status}, but a newer preflight or the app's deletion came first; the answer was not recorded.`;
}

/** Build, deploy and retry are refused with remediation text while the app is quarantined. */
export function requirePreflightPassed(app: Pick<App, "preflightStatus" | "appName" | "branch" | "configPath">): void {
  if (app.preflightStatus === "ready" || app.preflightStatus === "exempt") return;
  const remedy: Record<string, string> = {
    pending: "The repository check has not finished yet; try again in a moment.",
    no_access: "The platform cannot read the repository or branch: check the URL, the branch and access, then run preflight/recheck.",
    needs_config: `Add ${app.configPath} to the repository (or point config_path at the app's config file with PATCH /api/apps/${app.appName}), then run preflight/recheck.`,
    config_invalid: `Fix the errors in ${app.configPath} listed in preflight_result, then run preflight/recheck.`,
  };
  throw PlatformError.conflict({
    code: "preflight_quarantined",
    message: `App '${app.appName}' (branch ${app.branch}) is quarantined by preflight (${app.preflightStatus}). ${remedy[app.preflightStatus] ?? ""}`.trim(),
    preflight_status: app.preflightStatus,
  });
}

/**
 * The refusal of a build that registered its app (POST /api/builds for an unknown app): the app
 * stays registered, quarantined like every new app until its repository check passes.
 */
export function quarantinedAtRegistration(app: Pick<App, "preflightStatus" | "appName" | "branch" | "groupSlug">): PlatformError {
  return PlatformError.conflict({
    code: "preflight_quarantined",
    message:
      `App '${app.appName}' (branch ${app.branch}) was registered in group ${app.groupSlug} and is quarantined by preflight (${app.preflightStatus}) until its repository check passes. ` +
      `Follow preflight_status with GET /api/apps/${app.appName}?branch=${encodeURIComponent(app.branch)}, then trigger the build again.`,
    preflight_status: app.preflightStatus,
    registered: true,
  });
}
