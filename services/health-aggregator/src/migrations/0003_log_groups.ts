import { Migration } from "@platform/db";

/**
 * The log groups: one row per app, branch and service that container lines were ever stored
 * for, so an empty `source=container` answer can tell "nothing deployed there" (no_log_group)
 * from "deployed, but no output in the window" (no_output_yet) without searching every line.
 * A line may lack branch or service_name, so the key treats a missing one as a value of its
 * own (logship stores an empty name as null, so '' stands for no other name). Filled from the
 * lines already stored; kept by ingestion from then on.
 */
export class LogGroups extends Migration {
  override up(): void {
    this.addSql(`create table log_groups (
      id bigserial primary key,
      app_name text not null,
      branch text null,
      service_name text null,
      group_slug text null,
      first_seen timestamptz not null,
      last_seen timestamptz not null
    )`);
    this.addSql("create unique index log_groups_key on log_groups (app_name, coalesce(branch, ''), coalesce(service_name, ''))");
    this.addSql(`insert into log_groups (app_name, branch, service_name, group_slug, first_seen, last_seen)
      select app_name, branch, service_name, (array_agg(group_slug order by ts desc))[1], min(ts), max(ts)
      from log_lines where source = 'container' and app_name is not null group by app_name, branch, service_name`);
  }
}

export const logGroupsMigrations = [{ name: "0003_log_groups", class: LogGroups }];
