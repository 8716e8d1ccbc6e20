import { Migration } from "@platform/db";

export class BuildsTable extends Migration {
  override up(): void {
    this.addSql(`create table builds (
      id uuid primary key,
      app_id uuid not null references apps (id) on delete cascade deferrable initially deferred,
      app_name text not null,
      display_name text not null,
      group_slug text not null,
      branch text not null,
      tag text not null,
      commit_hash text null,
      commit_message text null,
      commit_author text null,
      commit_committed_at timestamptz null,
      status text not null check (status in ('pending', 'queued', 'in_progress', 'completed', 'failed', 'cancelled')),
      queue_status text not null,
      codebuild_phase text not null,
      duration_seconds integer null,
      images jsonb not null default '[]',
      error_message text null,
      log text null,
      auto_deploy boolean not null,
      deploy_action_id uuid null,
      created_by text not null,
      started_at timestamptz null,
      completed_at timestamptz null,
      created_at timestamptz not null default now(),
      updated_at timestamptz not null default now(),
      unique (app_name, tag)
    )`);
    this.addSql("create index builds_app on builds (app_name, branch, created_at desc)");
    this.addSql("create index builds_group on builds (group_slug, created_at desc)");
    // Prefix lookups of ids compare text.
    this.addSql("create index builds_id_text on builds ((id::text) text_pattern_ops)");
  }
}

export const buildMigrations = [{ name: "0003_builds", class: BuildsTable }];
