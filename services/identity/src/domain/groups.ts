/**
 * Groups (tenants) and who may see them. Another tenant's group is always "not found". Platform
 * operators create, rename and delete them; a rename or delete holds the group lock exclusively
 * (group-lock.ts), so it never lands in the middle of a registration.
 */
import { randomUUID } from "node:crypto";
import { LockMode, UniqueConstraintViolationException } from "@mikro-orm/core";
import { PlatformError } from "@platform/errors";
import { audit, enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { actorOf, canSeeGroup, requireOperator, type Caller } from "@platform/caller";
import { FormerGroupSlug, Group } from "../entities/index.ts";
import { acquireLease, confirmLease, releaseLease, type Lease, type LeaseOutcome, type Transact } from "./group-lock.ts";

/** A rename or delete waits this long for registrations in flight to finish. */
export const GROUP_CHANGE_WAIT_MS = 3_000;
/** Longer than any rename or delete takes; bounds how long a crashed one keeps the group locked. */
export const GROUP_CHANGE_LEASE_TTL_MS = 30_000;

const SLUG = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

export function validateSlug(slug: string): void {
  if (!SLUG.test(slug)) {
    throw PlatformError.invalid(
      "Group slug must be 1-63 characters of lowercase letters, digits and hyphens, starting and ending with a letter or digit.",
    );
  }
}

export function groupNotFound(slug: string): PlatformError {
  return PlatformError.notFound(`Group '${slug}' not found`);
}

/** The group, if the caller may see it; otherwise the same 404 whether it exists or not. */
export async function findVisibleGroup(em: EntityManager, caller: Caller, slug: string): Promise<Group> {
  if (!canSeeGroup(caller, slug)) throw groupNotFound(slug);
  const group = await em.findOne(Group, { slug });
  if (!group) throw groupNotFound(slug);
  return group;
}

function groupExists(slug: string): PlatformError {
  return PlatformError.conflict({ code: "group_exists", message: `Group '${slug}' already exists.` });
}

function checkDisplayName(input: string): string {
  const displayName = input.trim();
  if ([...displayName].length > 200) throw PlatformError.invalid("display_name must be at most 200 characters.");
  return displayName;
}

/**
 * A slug another group has, or had before a rename (it stays reserved to that group: rows and
 * log lines still on their way under it must never reach a new tenant).
 */
async function checkSlugFree(em: EntityManager, slug: string, groupId: string | null): Promise<void> {
  if (await em.findOne(Group, { slug })) throw groupExists(slug);
  const former = await em.findOne(FormerGroupSlug, { slug });
  if (former && former.groupId !== groupId) {
    throw PlatformError.conflict({ code: "group_slug_reserved", message: `The slug '${slug}' belonged to another group before it was renamed and stays reserved to it.` });
  }
}

export async function createGroup(transact: Transact, caller: Caller, input: { slug: string; displayName?: string }): Promise<Group> {
  requireOperator(caller);
  const slug = input.slug.trim();
  validateSlug(slug);
  const displayName = checkDisplayName(input.displayName ?? "") || slug;
  try {
    return await transact(async (em) => {
      await checkSlugFree(em, slug, null);
      const group = em.create(Group, { id: randomUUID(), slug, displayName, personal: false });
      audit(em, { actor: actorOf(caller), action: "group.create", target: slug, groupSlug: slug, details: { display_name: displayName } });
      enqueueEvent(em, subjects.events.groupCreated, { slug, display_name: displayName });
      return group;
    });
  } catch (err) {
    // Two creates of one slug at once: both found it free, the second's commit meets the first's row.
    if (err instanceof UniqueConstraintViolationException) throw groupExists(slug);
    throw err;
  }
}

export async function listGroups(em: EntityManager, caller: Caller): Promise<Group[]> {
  if (caller.platformOperator) return em.find(Group, {}, { orderBy: { slug: "asc" } });
  if (caller.visibleGroups.length === 0) return [];
  return em.find(Group, { slug: { $in: [...caller.visibleGroups] } }, { orderBy: { slug: "asc" } });
}

export interface GroupChange {
  newSlug?: string;
  displayName?: string;
}

/** The group lock as a rename or delete takes it: exclusive, or the request is refused. */
async function lockForChange(transact: Transact, caller: Caller, slug: string, change: string): Promise<Lease> {
  const outcome = await acquireLease(transact, {
    groupSlug: slug,
    mode: "exclusive",
    holder: `group.${change} by ${actorOf(caller)}`,
    ttlMs: GROUP_CHANGE_LEASE_TTL_MS,
    waitMs: GROUP_CHANGE_WAIT_MS,
  });
  return heldOrRefused(slug, outcome);
}

function heldOrRefused(slug: string, outcome: LeaseOutcome): Lease {
  switch (outcome.outcome) {
    case "granted":
    case "held":
      return outcome.lease;
    case "busy":
      throw PlatformError.conflict({
        code: "group_busy",
        message: `Group '${slug}' is locked by registrations or another change in progress; retry in ${outcome.retryAfterS} s.`,
        retry_after: outcome.retryAfterS,
      });
    default:
      // Renamed or deleted by another change meanwhile: no group has this slug any more.
      throw groupNotFound(slug);
  }
}

/**
 * PATCH /api/groups/{slug}: a new slug, a new display name, or both. The group keeps its id. A
 * rename holds the group lock exclusively, retires the old slug (reserved to this group) and
 * announces `group_renamed`, which the services keeping the slug re-key by.
 */
export async function updateGroup(transact: Transact, caller: Caller, slug: string, change: GroupChange): Promise<Group> {
  requireOperator(caller);
  const newSlug = change.newSlug?.trim();
  if (newSlug !== undefined) validateSlug(newSlug);
  // An empty display name is the default, as at creation: the slug.
  const displayName = change.displayName === undefined ? undefined : checkDisplayName(change.displayName) || newSlug || slug;
  if (newSlug === undefined || newSlug === slug) {
    return transact(async (em) => {
      const group = await em.findOne(Group, { slug });
      if (!group) throw groupNotFound(slug);
      if (displayName && displayName !== group.displayName) {
        audit(em, { actor: actorOf(caller), action: "group.update", target: slug, groupSlug: slug, details: { display_name: displayName, previous_display_name: group.displayName } });
        group.displayName = displayName;
        enqueueEvent(em, subjects.events.groupUpdated, { group_id: group.id, slug, display_name: displayName });
      }
      return group;
    });
  }

  const lease = await lockForChange(transact, caller, slug, "rename");
  try {
    return await transact(async (em) => {
      heldOrRefused(slug, await confirmLease(em, lease, GROUP_CHANGE_LEASE_TTL_MS));
      const group = await em.findOneOrFail(Group, { id: lease.groupId }, { lockMode: LockMode.PESSIMISTIC_WRITE, refresh: true });
      await checkSlugFree(em, newSlug, group.id);
      await em.nativeDelete(FormerGroupSlug, { slug: newSlug });
      em.create(FormerGroupSlug, { slug, groupId: group.id });
      group.slug = newSlug;
      if (displayName) group.displayName = displayName;
      audit(em, { actor: actorOf(caller), action: "group.rename", target: newSlug, groupSlug: newSlug, details: { previous_slug: slug, display_name: group.displayName } });
      enqueueEvent(em, subjects.events.groupRenamed, { group_id: group.id, slug: newSlug, previous_slug: slug, display_name: group.displayName });
      return group;
    });
  } catch (err) {
    // Two renames to one new slug at once: the second's commit meets the first's row.
    if (err instanceof UniqueConstraintViolationException) throw groupExists(newSlug);
    throw err;
  } finally {
    await transact((em) => releaseLease(em, lease.id));
  }
}

/**
 * DELETE /api/groups/{slug}. Refused while the group owns apps (asked of apps-builds under the
 * group lock, so no registration can add one meanwhile): they would be left without a tenant.
 * A user's personal group is never deleted. Memberships and the group's API keys go with it;
 * `group_deleted` names every slug the group had, so services drop what they keep under them.
 */
export async function deleteGroup(transact: Transact, caller: Caller, slug: string, appsIn: (slug: string) => Promise<number>): Promise<void> {
  requireOperator(caller);
  const found = await transact((em) => em.findOne(Group, { slug }));
  if (!found) throw groupNotFound(slug);
  if (found.personal) {
    throw PlatformError.conflict({ code: "personal_group", message: `Group '${slug}' is a user's personal group; it goes only with the account.` });
  }
  const lease = await lockForChange(transact, caller, slug, "delete");
  try {
    const slugs = [lease.groupSlug, ...lease.formerSlugs];
    // apps-builds moves the group's apps from slug to slug as it hears of each rename, oldest to
    // newest; asked in that order too, an app moving meanwhile is counted under one slug or the
    // next (twice at worst), never missed between them.
    let apps = 0;
    for (const s of [...lease.formerSlugs, lease.groupSlug]) apps += await appsIn(s);
    if (apps > 0) {
      throw PlatformError.conflict({
        code: "group_has_apps",
        message: `Group '${slug}' still owns ${apps} app branch(es); delete them before the group.`,
        app_count: apps,
      });
    }
    await transact(async (em) => {
      heldOrRefused(slug, await confirmLease(em, lease, GROUP_CHANGE_LEASE_TTL_MS));
      const group = await em.findOneOrFail(Group, { id: lease.groupId });
      em.remove(group);
      audit(em, { actor: actorOf(caller), action: "group.delete", target: slug, groupSlug: slug, details: { group_id: group.id, former_slugs: lease.formerSlugs } });
      enqueueEvent(em, subjects.events.groupDeleted, { group_id: group.id, slugs, deleted_at: new Date().toISOString() });
    });
  } finally {
    await transact((em) => releaseLease(em, lease.id));
  }
}
