/**
 * Builds apps-builds deleted (`builds_deleted`: a branch deleted, or its builds purged): their
 * lines go from the log store, with what ingestion keeps of them (log_builds), so that `source=build`
 * never counts a deleted build among an app's most recent. A deleted branch takes every line of
 * the branch with it: a branch registered again under the same name starts with none. Idempotent.
 */
import type { EntityManager } from "@platform/db";

export interface BuildsDeleted {
  groupSlug: string;
  appName: string;
  branch: string;
  buildIds: string[];
  branchDeleted: boolean;
}

export function parseBuildsDeleted(data: Record<string, unknown>): BuildsDeleted {
  const text = (key: string) => {
    const v = data[key];
    if (typeof v !== "string" || v === "") throw new Error(`builds_deleted: ${key} must be a non-empty string`);
    return v;
  };
  const ids = data.build_ids;
  if (!Array.isArray(ids) || !ids.every((id) => typeof id === "string")) throw new Error("builds_deleted: build_ids must be a list of strings");
  return { groupSlug: text("group_slug"), appName: text("app_name"), branch: text("branch"), buildIds: ids as string[], branchDeleted: data.branch_deleted === true };
}

export async function forgetBuilds(em: EntityManager, e: BuildsDeleted): Promise<void> {
  const run = (sql: string, params: unknown[]) => em.getConnection().execute(sql, params, "run", em.getTransactionContext());
  if (e.buildIds.length > 0) {
    await run("delete from log_lines where build_id in (?) and group_slug = ?", [e.buildIds, e.groupSlug]);
    await run("delete from log_builds where build_id in (?) and group_slug = ?", [e.buildIds, e.groupSlug]);
  }
  if (e.branchDeleted) await run("delete from log_lines where group_slug = ? and app_name = ? and branch = ?", [e.groupSlug, e.appName, e.branch]);
}
