/**
 * Preflight (spec doc 1 section 3.3): a new app is quarantined at `pending` until an agent has
 * tried its repository and config file. Only `ready` and `exempt` unlock build, deploy and retry.
 * Each re-queue bumps a nonce; an answer to an older request is ignored.
 */
import { PlatformError } from "@platform/errors";
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import type { App, PreflightResultData } from "../entities/index.ts";

export const PREFLIGHT_STATUSES = ["pending", "no_access", "needs_config", "config_invalid", "ready", "exempt"] as const;
export type PreflightStatus = (typeof PREFLIGHT_STATUSES)[number];

export interface PreflightRequest {
  app_id: string;
  nonce: number;
  repository: string;
  branch: string;
  config_path: string;
}

export interface PreflightAnswer {
  status: Exclude<PreflightStatus, "pending" | "exempt">;
  result: PreflightResultData | null;
  /** A valid config as authored at the branch's HEAD (status ready). */
  config?: Record<string, unknown>;
}

/** Queues a preflight for the app (through the outbox); returns its action id. */
export function requeuePreflight(em: EntityManager, app: App): string {
  app.preflightNonce += 1;
  if (app.preflightStatus !== "exempt") app.preflightStatus = "pending";
  const request: PreflightRequest = {
    app_id: app.id,
    nonce: app.preflightNonce,
    repository: app.repository,
    branch: app.branch,
    config_path: app.configPath,
  };
  return enqueueEvent(em, subjects.events.preflightRequested, { ...request });
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
