/**
 * Builds apps-builds deleted (`builds_deleted`: a branch deleted, or its builds purged): their
 * lines go from the log store, with what ingestion keeps of them (log_builds), so that `source=build`
 * never counts a deleted build among an app's most recent. A deleted branch takes every line of
 * the branch with it, and its log groups: a branch registered again under the same name starts
 * with none. Lines still on their way follow (forgetting.ts). Idempotent.
 */
import type { EntityManager } from "@platform/db";
import type { BuildsDeleted } from "@platform/bus";
import { holdForgetting } from "./forgetting.ts";

/** Bind parameters stay far below Postgres's 65,535 for a branch of many builds. */
const TOMBSTONES_PER_STATEMENT = 1000;

export async function forgetBuilds(em: EntityManager, e: BuildsDeleted): Promise<void> {
  await holdForgetting(em);
  const run = (sql: string, params: unknown[]) => em.getConnection().execute(sql, params, "run", em.getTransactionContext());
  for (let i = 0; i < e.buildIds.length; i += TOMBSTONES_PER_STATEMENT) {
    const ids = e.buildIds.slice(i, i + TOMBSTONES_PER_STATEMENT);
    await run(
      `insert into log_forgotten_builds (build_id, forgotten_at) values ${ids.map(() => "(?, ?)").join(", ")} on conflict (build_id) do nothing`,
      ids.flatMap((id) => [id, e.deletedAt]),
    );
  }
  if (e.buildIds.length > 0) {
    await run("delete from log_lines where build_id in (?) and group_slug = ?", [e.buildIds, e.groupSlug]);
    await run("delete from log_builds where build_id in (?) and group_slug = ?", [e.buildIds, e.groupSlug]);
  }
  if (e.branchDeleted) {
    await run(
      `insert into log_forgotten_branches (group_slug, app_name, branch, forgotten_at) values (?, ?, ?, ?)
       on conflict (group_slug, app_name, branch) do update set forgotten_at = greatest(log_forgotten_branches.forgotten_at, excluded.forgotten_at)`,
      [e.groupSlug, e.appName, e.branch, e.deletedAt],
    );
    await run("delete from log_lines where group_slug = ? and app_name = ? and branch = ?", [e.groupSlug, e.appName, e.branch]);
    // The branch registered again has printed nothing yet: no_log_group, not no_output_yet.
    await run("delete from log_groups where group_slug = ? and app_name = ? and branch = ?", [e.groupSlug, e.appName, e.branch]);
  }
}
