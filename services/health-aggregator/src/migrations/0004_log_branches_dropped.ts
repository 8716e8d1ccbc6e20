import { Migration } from "@platform/db";

/**
 * log_branches kept which group owned a branch as its shipped lines told, for the access check of
 * `branch` on GET /api/logs. That check is now made against the app's registered branches
 * (apps-builds, by the gateway): a branch with no lines yet hid every line of its app.
 */
export class LogBranchesDropped extends Migration {
  override up(): void {
    this.addSql("drop table if exists log_branches");
  }
}

export const logBranchesDroppedMigrations = [{ name: "0004_log_branches_dropped", class: LogBranchesDropped }];
