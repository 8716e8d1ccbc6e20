/**
 * Finding actions for tenants: by id or id prefix (at least 8 hex-or-hyphen characters, spec doc
 * 1 section 8), authorised against the group that owns the action. Unknown, ambiguous and another
 * group's ids all answer the same 404: the API never confirms another tenant's action exists.
 */
import { LockMode } from "@mikro-orm/core";
import { PlatformError, checkIdPrefix } from "@platform/errors";
import { canSeeGroup, type Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";

/** 422 for a short, long or wildcard-shaped id; the normalised prefix otherwise. */
export function checkActionIdPrefix(id: string): string {
  return checkIdPrefix(id, "an action id");
}

export function actionNotFound(id: string): PlatformError {
  return PlatformError.notFound(`Action '${id}' not found`);
}

/**
 * An operator who selected a group (`?group=`, X-Platform-Group) acts in that group alone, by id
 * as in listings (spec doc 1 section 1: "they may target one group"); one who selected none,
 * in every group.
 */
function inOperatorSelection(caller: Caller, groupSlug: string): boolean {
  return !caller.explicitGroup || groupSlug === caller.selectedGroup;
}

/** Reads: any group the caller may see ("authorised against its owner"); operators, the one they selected or all. */
export function canRead(caller: Caller, groupSlug: string): boolean {
  if (caller.platformOperator) return inOperatorSelection(caller, groupSlug);
  return canSeeGroup(caller, groupSlug);
}

/**
 * Changes (cancel, prioritize, admit-force): the group the caller acts in, where its scope was
 * checked; operators, the one they selected or any.
 */
export function canAct(caller: Caller, groupSlug: string): boolean {
  if (caller.platformOperator) return inOperatorSelection(caller, groupSlug);
  return groupSlug === caller.selectedGroup && canSeeGroup(caller, groupSlug);
}

/**
 * The one action whose id starts with `prefix` among those `visible` admits, or null (none, or
 * more than one). With `lock`, the row is locked for update (SELECT ... FOR UPDATE).
 */
export async function findActionByPrefix(
  em: EntityManager,
  prefix: string,
  visible: (groupSlug: string) => boolean,
  opts: { lock?: boolean } = {},
): Promise<Action | null> {
  const rows = await em
    .getConnection()
    .execute<{ id: string; group_slug: string }[]>(
      "select id, group_slug from actions where id::text like ? order by id limit 50",
      [`${prefix.toLowerCase()}%`],
      "all",
      em.getTransactionContext(),
    );
  const matches = rows.filter((r) => visible(r.group_slug));
  if (matches.length !== 1) return null;
  return em.findOne(Action, { id: matches[0]!.id }, opts.lock ? { lockMode: LockMode.PESSIMISTIC_WRITE } : {});
}

/** GetAction / DiagnoseAction: 422 for a malformed id, 404 for anything the caller cannot read. */
export async function getVisibleAction(em: EntityManager, caller: Caller, id: string): Promise<Action> {
  const prefix = checkActionIdPrefix(id.trim());
  const action = await findActionByPrefix(em, prefix, (g) => canRead(caller, g));
  if (!action) throw actionNotFound(id);
  return action;
}

/** Status of each action's dependency, for stuck_class. */
export async function dependencyStatuses(em: EntityManager, actions: Action[]): Promise<Map<string, Action>> {
  const ids = [...new Set(actions.map((a) => a.dependsOn).filter((d): d is string => !!d))];
  if (ids.length === 0) return new Map();
  const deps = await em.find(Action, { id: { $in: ids } });
  return new Map(deps.map((d) => [d.id, d]));
}
