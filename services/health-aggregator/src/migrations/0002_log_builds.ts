import { Migration } from "@platform/db";

/**
 * The builds the shipped build lines tell of (first and last line): `source=build` reads the
 * lines of the most recent ones without a scan of every build line in the window. Filled from
 * the lines already stored; kept by ingestion from then on.
 */
export class LogBuilds extends Migration {
  override up(): void {
    this.addSql(`create table log_builds (
      build_id text primary key,
      app_name text null,
      group_slug text null,
      first_ts timestamptz not null,
      last_ts timestamptz not null
    )`);
    this.addSql("create index log_builds_recent on log_builds (first_ts)");
    this.addSql("create index log_builds_app on log_builds (app_name, first_ts)");
    this.addSql("create index log_builds_group on log_builds (group_slug, first_ts)");
    this.addSql(`insert into log_builds (build_id, app_name, group_slug, first_ts, last_ts)
      select build_id, (array_agg(app_name order by ts desc))[1], (array_agg(group_slug order by ts desc))[1], min(ts), max(ts)
      from log_lines where source = 'build' and build_id is not null group by build_id`);
  }
}

export const logBuildsMigrations = [{ name: "0002_log_builds", class: LogBuilds }];
