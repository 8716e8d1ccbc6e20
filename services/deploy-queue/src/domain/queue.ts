/**
 * Reading the queue (spec doc 1 section 4.5, GET /api/deployments/queue): live rows by default,
 * terminal rows too with `all`; `exclude_types` removes types (unknown types stay visible);
 * `limit` 1-500, default 100. Rows come newest first (created_at, then id, descending); priority
 * does not reorder the listing, it orders admission (see admission.ts).
 *
 * Scoping: a tenant sees the group it acts in; an operator sees every group unless it selected
 * one (?group= or X-Platform-Group).
 */
import { appNameKey } from "@platform/bus";
import { PlatformError } from "@platform/errors";
import { canSeeGroup, spansEveryGroup, type Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { Action, Agent } from "../entities/index.ts";
import { LIVE_STATUSES } from "./lifecycle.ts";
import { dependencyStatuses } from "./lookup.ts";
import { stuckClass, type StuckClass } from "./stuck.ts";

export const QUEUE_LIMIT = { min: 1, max: 500, default: 100 } as const;

export interface ListFilters {
  appName?: string;
  all?: boolean;
  excludeTypes?: string[];
  /** 0 or missing: the default. */
  limit?: number;
}

export interface ActionView {
  action: Action;
  stuckClass: StuckClass | null;
}

export function resolveLimit(limit: number | undefined): number {
  if (!limit) return QUEUE_LIMIT.default;
  if (!Number.isInteger(limit) || limit < QUEUE_LIMIT.min || limit > QUEUE_LIMIT.max) {
    throw PlatformError.invalid(`limit must be between ${QUEUE_LIMIT.min} and ${QUEUE_LIMIT.max}.`);
  }
  return limit;
}

/** `exclude_types` may come as repeated values or comma lists; matched case-insensitively. */
export function normalizeTypes(types: string[] = []): string[] {
  return [...new Set(types.flatMap((t) => t.split(",")).map((t) => t.trim().toUpperCase()).filter(Boolean))];
}

export async function withStuckClass(em: EntityManager, actions: Action[], now: Date): Promise<ActionView[]> {
  // Only a queued action's stuck class depends on its dependency, and only a running one's on
  // its host's heartbeat (see stuckClass).
  const deps = await dependencyStatuses(em, actions.filter((a) => a.status === "queued"));
  const claimers = [...new Set(actions.filter((a) => a.status === "in_progress" && a.claimedBy).map((a) => a.claimedBy!))];
  const lastSeen = new Map(claimers.length > 0 ? (await em.find(Agent, { hostId: { $in: claimers } })).map((a) => [a.hostId, a.lastSeen]) : []);
  return actions.map((action) => ({
    action,
    stuckClass: stuckClass(
      action,
      action.dependsOn ? (deps.get(action.dependsOn)?.status ?? null) : null,
      now,
      action.claimedBy ? (lastSeen.get(action.claimedBy) ?? null) : null,
    ),
  }));
}

export async function listQueue(em: EntityManager, caller: Caller, f: ListFilters, now: Date): Promise<ActionView[]> {
  const limit = resolveLimit(f.limit);
  const where: Record<string, unknown> = {};
  if (!spansEveryGroup(caller)) {
    if (!caller.selectedGroup || !canSeeGroup(caller, caller.selectedGroup)) return [];
    where.groupSlug = caller.selectedGroup;
  }
  if (f.appName) where.appName = appNameKey(f.appName);
  if (!f.all) where.status = { $in: [...LIVE_STATUSES] };
  const excluded = normalizeTypes(f.excludeTypes);
  if (excluded.length > 0) where.actionType = { $nin: excluded };
  const actions = await em.find(Action, where, { orderBy: { createdAt: "desc", id: "desc" }, limit });
  return withStuckClass(em, actions, now);
}
