/**
 * The group lock (spec doc 1 sections 4.4 and 7): leases on a group, kept by identity, the owner
 * of groups. A registration holds a shared lease for the length of its write, so registrations in
 * one group never block each other; a rename or a delete holds an exclusive one. Every lease
 * expires, so a holder that crashed frees the group by itself. An exclusive request that has to
 * wait takes its place in the queue: shared requests arriving after it wait behind it, so a steady
 * stream of registrations cannot keep a rename out for ever.
 */
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { LockMode } from "@mikro-orm/core";
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { FormerGroupSlug, Group, GroupLease } from "../entities/index.ts";

export const LEASE_MODES = ["shared", "exclusive"] as const;
export type LeaseMode = (typeof LEASE_MODES)[number];

export const MAX_LEASE_TTL_MS = 60_000;
export const MAX_LEASE_WAIT_MS = 10_000;
/** How often a waiting request looks again. */
const POLL_MS = 100;
/**
 * A queued exclusive request is kept alive by its waiter's every look; one whose waiter died stops
 * holding the queue this long after its last look.
 */
const QUEUED_TTL_MS = 1_000;

export interface LeaseRequest {
  groupSlug: string;
  mode: string;
  holder: string;
  ttlMs: number;
  waitMs: number;
}

export interface Lease {
  id: string;
  groupId: string;
  groupSlug: string;
  /** The slugs renames took from the group, oldest first. */
  formerSlugs: string[];
  mode: LeaseMode;
  expiresAt: Date;
}

/**
 * What a request for (or a confirmation of) a lease comes to. `renamed` and `deleted` describe a
 * group that changed while the caller waited for it or held its lease (`renamed` also a slug a
 * rename had just retired when the request came); `not_found` a slug that names no group.
 */
export type LeaseOutcome =
  | { outcome: "granted" | "held"; lease: Lease }
  | { outcome: "busy"; retryAfterS: number }
  | { outcome: "renamed"; groupSlug: string }
  | { outcome: "deleted" }
  | { outcome: "not_found" };

/** Runs its argument in one transaction (ServiceContext.write). */
export type Transact = <T>(fn: (em: EntityManager) => Promise<T>) => Promise<T>;

export interface LeaseView {
  id: string;
  mode: string;
  requestedAt: Date;
  /** Unset: an exclusive request still queued. */
  grantedAt?: Date | null;
  expiresAt: Date;
}

/**
 * The leases that keep a request from being granted now. A shared request waits for any live
 * exclusive lease, held or queued; an exclusive one for any held lease, and for exclusive requests
 * queued before its own (`own`, the request's queued row, if it has one).
 */
export function blockingLeases(mode: LeaseMode, leases: LeaseView[], now: Date, own: LeaseView | null = null): LeaseView[] {
  const live = leases.filter((l) => l.expiresAt > now && l.id !== own?.id);
  if (mode === "shared") return live.filter((l) => l.mode === "exclusive");
  return live.filter((l) => l.grantedAt || !own || queuedBefore(l, own));
}

function queuedBefore(a: LeaseView, b: LeaseView): boolean {
  return a.requestedAt < b.requestedAt || (a.requestedAt.getTime() === b.requestedAt.getTime() && a.id < b.id);
}

/** Seconds until every blocking lease has expired at the latest: when retrying is sure to find them gone. */
export function retryAfterSeconds(blocking: LeaseView[], now: Date): number {
  const last = Math.max(...blocking.map((l) => l.expiresAt.getTime()));
  return Math.max(1, Math.ceil((last - now.getTime()) / 1000));
}

function checkMode(mode: string): LeaseMode {
  if (!(LEASE_MODES as readonly string[]).includes(mode)) throw PlatformError.invalid(`mode must be one of ${LEASE_MODES.join(", ")}.`);
  return mode as LeaseMode;
}

export function checkLeaseRequest(req: LeaseRequest): LeaseMode {
  const mode = checkMode(req.mode);
  if (!Number.isInteger(req.ttlMs) || req.ttlMs < 1 || req.ttlMs > MAX_LEASE_TTL_MS) {
    throw PlatformError.invalid(`ttl_ms must be between 1 and ${MAX_LEASE_TTL_MS}.`);
  }
  if (!Number.isInteger(req.waitMs) || req.waitMs < 0 || req.waitMs > MAX_LEASE_WAIT_MS) {
    throw PlatformError.invalid(`wait_ms must be between 0 and ${MAX_LEASE_WAIT_MS}.`);
  }
  if (!req.holder.trim()) throw PlatformError.invalid("holder is required: say who takes the lease.");
  return mode;
}

async function lockGroup(em: EntityManager, where: { id: string } | { slug: string }): Promise<Group | null> {
  return em.findOne(Group, where, { lockMode: LockMode.PESSIMISTIC_WRITE, refresh: true });
}

async function formerSlugs(em: EntityManager, groupId: string): Promise<string[]> {
  const rows = await em.find(FormerGroupSlug, { groupId }, { orderBy: { retiredAt: "asc" } });
  return rows.map((r) => r.slug);
}

/** The slug now of the group a rename took `former` from; null when no group had it. */
async function currentSlugOf(em: EntityManager, former: string): Promise<string | null> {
  const retired = await em.findOne(FormerGroupSlug, { slug: former });
  if (!retired) return null;
  return (await em.findOne(Group, { id: retired.groupId }, { fields: ["slug"] }))?.slug ?? null;
}

/** The group's leases, and those still live; expired ones other than `keep` are dropped on the way. */
async function leasesOf(em: EntityManager, groupId: string, now: Date, keep?: string): Promise<{ rows: GroupLease[]; live: GroupLease[] }> {
  const rows = await em.find(GroupLease, { groupId });
  for (const row of rows) if (row.expiresAt <= now && row.id !== keep) em.remove(row);
  return { rows, live: rows.filter((r) => r.expiresAt > now) };
}

async function leaseOf(em: EntityManager, row: GroupLease, group: Group): Promise<Lease> {
  return { id: row.id, groupId: group.id, groupSlug: group.slug, formerSlugs: await formerSlugs(em, group.id), mode: row.mode as LeaseMode, expiresAt: row.expiresAt };
}

type Attempt = LeaseOutcome | { outcome: "waiting"; groupId: string; queuedId: string | null; retryAfterS: number };

/**
 * One look, in one transaction holding the group's row lock (so two looks at one group never
 * decide at once). The first look finds the group by slug; later ones by id, so that a group
 * renamed or deleted meanwhile is told apart from one that never existed.
 */
async function attempt(em: EntityManager, req: LeaseRequest & { mode: LeaseMode }, waitingOn: { groupId: string; queuedId: string | null } | null, now: Date): Promise<Attempt> {
  const group = await lockGroup(em, waitingOn ? { id: waitingOn.groupId } : { slug: req.groupSlug });
  if (!group && waitingOn) return { outcome: "deleted" };
  if (!group) {
    // A slug a rename retired: the caller read it before the rename committed (a credential
    // resolved a moment earlier), so the group was renamed during its request.
    const current = await currentSlugOf(em, req.groupSlug);
    return current ? { outcome: "renamed", groupSlug: current } : { outcome: "not_found" };
  }
  const { live } = await leasesOf(em, group.id, now);
  const queued = live.find((l) => l.id === waitingOn?.queuedId) ?? null;
  if (group.slug !== req.groupSlug) {
    if (queued) em.remove(queued);
    return { outcome: "renamed", groupSlug: group.slug };
  }
  const blocking = blockingLeases(req.mode, live, now, queued);
  if (blocking.length > 0) {
    let queuedId: string | null = null;
    if (req.mode === "exclusive") {
      // A queued row that lapsed (a look slower than QUEUED_TTL_MS) is queued anew, at the back.
      const row =
        queued ?? em.create(GroupLease, { id: randomUUID(), groupId: group.id, mode: "exclusive", holder: req.holder, requestedAt: now, grantedAt: null, expiresAt: now });
      row.expiresAt = new Date(now.getTime() + QUEUED_TTL_MS);
      queuedId = row.id;
    }
    return { outcome: "waiting", groupId: group.id, queuedId, retryAfterS: retryAfterSeconds(blocking, now) };
  }
  const expiresAt = new Date(now.getTime() + req.ttlMs);
  const row = queued ?? em.create(GroupLease, { id: randomUUID(), groupId: group.id, mode: req.mode, holder: req.holder, requestedAt: now, grantedAt: null, expiresAt });
  row.grantedAt = now;
  row.expiresAt = expiresAt;
  return { outcome: "granted", lease: await leaseOf(em, row, group) };
}

/**
 * Takes a lease, waiting up to `waitMs` while a conflicting one is held. Each look commits on its
 * own, so the leases granted or queued are seen by every other request at once.
 */
export async function acquireLease(transact: Transact, req: LeaseRequest): Promise<LeaseOutcome> {
  const mode = checkLeaseRequest(req);
  const request = { ...req, mode };
  const deadline = Date.now() + req.waitMs;
  let waitingOn: { groupId: string; queuedId: string | null } | null = null;
  for (;;) {
    const a = await transact((em) => attempt(em, request, waitingOn, new Date()));
    if (a.outcome !== "waiting") return a;
    waitingOn = { groupId: a.groupId, queuedId: a.queuedId };
    const remaining = deadline - Date.now();
    if (remaining <= 0) {
      const queuedId = a.queuedId;
      if (queuedId) await transact(async (em) => void (await em.nativeDelete(GroupLease, { id: queuedId })));
      return { outcome: "busy", retryAfterS: a.retryAfterS };
    }
    await sleep(Math.min(POLL_MS, remaining));
  }
}

/**
 * Before the holder commits what the lease covers: the group must still be there under the slug
 * the lease was granted for, and the lease still held. A lease that expired is taken again when
 * nothing conflicts (nothing can have happened to the group then); otherwise the holder has lost
 * it. A confirmed lease lives `ttlMs` more.
 */
export async function confirmLease(em: EntityManager, lease: { id: string; groupId: string; groupSlug: string; mode: string }, ttlMs: number, now = new Date()): Promise<LeaseOutcome> {
  if (!Number.isInteger(ttlMs) || ttlMs < 1 || ttlMs > MAX_LEASE_TTL_MS) throw PlatformError.invalid(`ttl_ms must be between 1 and ${MAX_LEASE_TTL_MS}.`);
  if (!isUuid(lease.id) || !isUuid(lease.groupId)) throw PlatformError.invalid("lease.id and lease.group_id must be the ids a granted lease carries.");
  const mode = checkMode(lease.mode);
  const group = await lockGroup(em, { id: lease.groupId });
  if (!group) return { outcome: "deleted" };
  if (group.slug !== lease.groupSlug) return { outcome: "renamed", groupSlug: group.slug };
  const { rows, live } = await leasesOf(em, group.id, now, lease.id);
  let row = rows.find((r) => r.id === lease.id);
  if (!row || !row.grantedAt || row.expiresAt <= now) {
    const blocking = blockingLeases(mode, live, now, row ?? null);
    if (blocking.length > 0) return { outcome: "busy", retryAfterS: retryAfterSeconds(blocking, now) };
    row ??= em.create(GroupLease, { id: lease.id, groupId: group.id, mode, holder: "taken again after lapsing", requestedAt: now, grantedAt: now, expiresAt: now });
    row.grantedAt = now;
  }
  row.expiresAt = new Date(now.getTime() + ttlMs);
  return { outcome: "held", lease: await leaseOf(em, row, group) };
}

function isUuid(id: string): boolean {
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(id);
}

export async function releaseLease(em: EntityManager, id: string): Promise<void> {
  if (!isUuid(id)) return;
  await em.nativeDelete(GroupLease, { id });
}
