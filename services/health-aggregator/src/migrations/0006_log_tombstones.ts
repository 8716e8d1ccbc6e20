import { Migration } from "@platform/db";

/**
 * What was forgotten, kept so that lines arriving after it (shipped late, or redelivered from the
 * LOGS stream) are not stored again: the builds deleted, the branches deleted and the groups
 * deleted, each with when; and the slugs groups were renamed away from, so that a line still
 * carrying one is stored under the group's slug now. See domain/forgetting.ts.
 */
export class LogTombstones extends Migration {
  override up(): void {
    this.addSql("create table log_forgotten_builds (build_id text primary key, forgotten_at timestamptz not null)");
    this.addSql(`create table log_forgotten_branches (
      group_slug text not null,
      app_name text not null,
      branch text not null,
      forgotten_at timestamptz not null,
      primary key (group_slug, app_name, branch)
    )`);
    this.addSql("create table log_forgotten_groups (slug text primary key, forgotten_at timestamptz not null)");
    this.addSql("create table log_group_renames (previous_slug text primary key, slug text not null)");
    this.addSql("create index log_group_renames_slug on log_group_renames (slug)");
  }
}

export const logTombstonesMigrations = [{ name: "0006_log_tombstones", class: LogTombstones }];
