import { Migration } from "@platform/db";

/**
 * The log store. Every query filters on `ts` and orders by `(ts, id)` descending, so each btree
 * ends in `(ts, id)`: a filtered page is read straight off one index, newest first, and stops
 * at the limit. Full-text search goes through the GIN index on the stored tsvector.
 */
export class LogTables extends Migration {
  override up(): void {
    this.addSql(`create table log_lines (
      id bigserial primary key,
      line_id uuid not null,
      ts timestamptz not null,
      source text not null check (source in ('agent', 'deploy', 'build', 'container', 'backup')),
      level text not null check (level in ('info', 'warning', 'error')),
      app_name text null,
      branch text null,
      group_slug text null,
      service_name text null,
      deployment_id text null,
      build_id text null,
      action_id text null,
      instance_id text null,
      message text not null,
      metadata jsonb not null default '{}',
      message_tsv tsvector generated always as (to_tsvector('simple', message)) stored
    )`);
    // Idempotent ingestion: a line delivered twice is stored once.
    this.addSql("create unique index log_lines_line_id on log_lines (line_id)");
    this.addSql("create index log_lines_message_tsv on log_lines using gin (message_tsv)");
    // Operators without filters; the window of every query.
    this.addSql("create index log_lines_ts on log_lines (ts, id)");
    this.addSql("create index log_lines_app_ts on log_lines (app_name, ts, id)");
    // A tenant without app_name reads its group's lines.
    this.addSql("create index log_lines_group_ts on log_lines (group_slug, ts, id)");
    this.addSql("create index log_lines_source_ts on log_lines (source, ts, id)");
    this.addSql("create index log_lines_build on log_lines (build_id, ts, id) where build_id is not null");
    this.addSql("create index log_lines_action on log_lines (action_id, ts, id) where action_id is not null");
    this.addSql("create index log_lines_deployment on log_lines (deployment_id, ts, id) where deployment_id is not null");
    this.addSql(`create table log_branches (
      app_name text not null,
      branch text not null,
      group_slug text null,
      last_seen_at timestamptz not null,
      primary key (app_name, branch)
    )`);
  }
}

export const migrations = [{ name: "0001_logs", class: LogTables }];
