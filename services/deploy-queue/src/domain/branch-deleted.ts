/**
 * A branch deleted (DELETE /api/apps/{app}, told by apps-builds' `builds_deleted` with
 * `branch_deleted`): its deployment history and its queue actions go with it, as its builds and
 * log lines do elsewhere. A branch registered again under the same name starts with none of the
 * old one's records (its deployments, history and queue would otherwise be the new app's on its
 * first read, environment snapshots included). An action still in progress stays to report its
 * end; the deletion is refused while a deploy or build of the branch is in flight, so that is at
 * most a preflight or a service action. Idempotent.
 */
import type { EntityManager } from "@platform/db";
import type { BuildsDeleted } from "@platform/bus";
import { currentSlugs } from "./groups.ts";

export async function forgetDeletedBranch(em: EntityManager, e: BuildsDeleted): Promise<void> {
  if (!e.branchDeleted) return;
  const group = (await currentSlugs(em, [e.groupSlug])).get(e.groupSlug) ?? e.groupSlug;
  const conn = em.getConnection();
  const tx = em.getTransactionContext();
  const branch = [group, e.appName, e.branch];
  // Only what was there when the branch was deleted: an event read late (a consumer replaying the
  // stream) must not take the records of the branch registered again since.
  await conn.execute("delete from deployment_history where group_slug = ? and app_name = ? and branch = ? and completed_at <= ?", [...branch, e.deletedAt], "run", tx);
  await conn.execute(
    "delete from actions where group_slug = ? and app_name = ? and branch = ? and status <> 'in_progress' and created_at <= ?",
    [...branch, e.deletedAt],
    "run",
    tx,
  );
}
