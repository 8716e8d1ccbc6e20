/**
 * Groups (tenants) and who may see them. Another tenant's group is always "not found".
 */
import { randomUUID } from "node:crypto";
import { PlatformError } from "@platform/errors";
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { canSeeGroup, requireOperator, type Caller } from "@platform/caller";
import { Group } from "../entities/index.ts";
import { actorOf, audit } from "./audit.ts";

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

export async function createGroup(em: EntityManager, caller: Caller, input: { slug: string; displayName?: string }): Promise<Group> {
  requireOperator(caller);
  const slug = input.slug.trim();
  validateSlug(slug);
  const displayName = (input.displayName ?? "").trim() || slug;
  if (displayName.length > 200) throw PlatformError.invalid("display_name must be at most 200 characters.");
  if (await em.findOne(Group, { slug })) {
    throw PlatformError.conflict({ code: "group_exists", message: `Group '${slug}' already exists.` });
  }
  const group = em.create(Group, { id: randomUUID(), slug, displayName, personal: false });
  audit(em, { actor: actorOf(caller), action: "group.create", target: slug, groupSlug: slug, details: { display_name: displayName } });
  enqueueEvent(em, subjects.events.groupCreated, { slug, display_name: displayName });
  return group;
}

export async function listGroups(em: EntityManager, caller: Caller): Promise<Group[]> {
  if (caller.platformOperator) return em.find(Group, {}, { orderBy: { slug: "asc" } });
  if (caller.visibleGroups.length === 0) return [];
  return em.find(Group, { slug: { $in: [...caller.visibleGroups] } }, { orderBy: { slug: "asc" } });
}
