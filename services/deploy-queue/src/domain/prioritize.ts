/**
 * Prioritize (spec doc 1 section 4.5): `target` is an action id prefix (that action, and when it
 * is a BUILD its dependent deploy) or an app slug (every live action of the app). It must resolve
 * inside the caller's group: an id in the group the caller acts in (operators: any group), an app
 * in the group the caller acts in (an operator who named none: the one group that has the app
 * queued or running; several is 409 `app_in_several_groups`). The bumped actions get a priority
 * above every live action of their group, so they go first wherever a per-host gate lets fewer
 * through than are waiting.
 */
import { PlatformError, isIdPrefix } from "@platform/errors";
import { canSeeGroup, spansEveryGroup, type Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { LIVE_STATUSES, isTerminal } from "./lifecycle.ts";
import { canAct, findActionByPrefix } from "./lookup.ts";

const LIVE = [...LIVE_STATUSES];

export interface Prioritized {
  actionIds: string[];
  priority: number;
}

export async function prioritize(em: EntityManager, caller: Caller, rawTarget: string): Promise<Prioritized> {
  // App slugs are lower case, and every app route takes the name in any case; so do ids.
  const target = rawTarget.trim().toLowerCase();
  if (!target) throw PlatformError.invalid("target is required: an app slug or an action id prefix (at least 8 characters).");

  let targets: Action[] = [];
  // The target resolves inside the caller's group (spec 4.5): the one selected, when an operator
  // selected one too.
  const byId = isIdPrefix(target) ? await findActionByPrefix(em, target, (g) => canAct(caller, g), { lock: true }) : null;
  if (byId) {
    if (isTerminal(byId.status)) {
      throw PlatformError.conflict({ code: "action_finished", message: `Action ${byId.id} is already ${byId.status}; only queued or running actions can be prioritized.`, status: byId.status });
    }
    targets = [byId];
    if (byId.actionType === "BUILD") {
      targets.push(...(await em.find(Action, { dependsOn: byId.id, status: { $in: LIVE } })));
    }
  } else if (spansEveryGroup(caller)) {
    // An operator who named no group: the app in whichever group has it, if only one does.
    targets = await em.find(Action, { appName: target, status: { $in: LIVE } }, { orderBy: { createdAt: "asc" } });
    const groups = [...new Set(targets.map((a) => a.groupSlug))].sort();
    if (groups.length > 1) {
      throw PlatformError.conflict({
        code: "app_in_several_groups",
        message: `App '${target}' has queued or running actions in groups ${groups.map((g) => `'${g}'`).join(", ")}; name one with ?group=.`,
        groups,
      });
    }
    if (targets.length === 0) throw PlatformError.notFound(`Nothing to prioritize: '${target}' is neither a queued or running action nor an app with one in any group.`);
  } else {
    const group = caller.selectedGroup;
    if (group && canSeeGroup(caller, group)) {
      targets = await em.find(Action, { groupSlug: group, appName: target, status: { $in: LIVE } }, { orderBy: { createdAt: "asc" } });
    }
    if (targets.length === 0) {
      throw PlatformError.notFound(`Nothing to prioritize: '${target}' is neither a queued or running action nor an app with one in group '${group}'.`);
    }
  }

  const groups = [...new Set(targets.map((a) => a.groupSlug))];
  const [row] = await em
    .getConnection()
    .execute<{ top: number | null }[]>(
      "select max(priority)::int as top from actions where group_slug in (?) and status in ('queued', 'in_progress')",
      [groups],
      "all",
      em.getTransactionContext(),
    );
  const priority = Number(row?.top ?? 0) + 1;
  for (const a of targets) a.priority = priority;
  return { actionIds: targets.map((a) => a.id), priority };
}
