import { Migration } from "@platform/db";

export class QueueTables extends Migration {
  override up(): void {
    this.addSql(`create table actions (
      id uuid primary key,
      action_type text not null,
      status text not null check (status in ('queued', 'in_progress', 'completed', 'failed', 'cancelled')),
      group_slug text not null,
      app_name text not null,
      branch text not null,
      image_tag text null,
      commit_message text null,
      commit_author text null,
      depends_on uuid null,
      auto_deploy boolean not null default false,
      admission_check_reason text null,
      last_admission_check_at timestamptz null,
      deploy_warnings jsonb not null default '[]',
      service_name text null,
      action text null check (action is null or action in ('restart', 'stop', 'start')),
      payload jsonb not null default '{}',
      result jsonb null,
      phase text null,
      error_message text null,
      claimed_by text null,
      claimed_at timestamptz null,
      progress_at timestamptz null,
      completed_at timestamptz null,
      priority integer not null default 0,
      cancel_requested boolean not null default false,
      cancel_reason text null,
      swap_committed_at timestamptz null,
      admit_force_until timestamptz null,
      admit_force_reason text null,
      admit_force_by text null,
      admit_force_used boolean not null default false,
      dispatched_to text null,
      dispatched_at timestamptz null,
      retry_count integer not null default 0,
      created_by text not null,
      created_at timestamptz not null default now(),
      updated_at timestamptz not null default now(),
      check (status <> 'queued' or claimed_by is null),
      check (status <> 'in_progress' or claimed_by is not null)
    )`);
    // Listing: a group's queue, newest first; an app's queue; the live (non-terminal) rows.
    this.addSql("create index actions_group on actions (group_slug, created_at desc)");
    this.addSql("create index actions_app on actions (app_name, branch, created_at desc)");
    this.addSql("create index actions_live on actions (status, created_at) where status in ('queued', 'in_progress')");
    // Gates and placement count a host's in-flight work.
    this.addSql("create index actions_claimed on actions (claimed_by, action_type) where status = 'in_progress'");
    this.addSql("create index actions_dispatched on actions (dispatched_to) where status = 'queued'");
    // Cascades find an action's dependents.
    this.addSql("create index actions_depends_on on actions (depends_on) where depends_on is not null");
    // Pruning finds terminal rows by age.
    this.addSql("create index actions_terminal on actions (completed_at) where status in ('completed', 'failed', 'cancelled')");
    // Prefix lookups of ids compare text.
    this.addSql("create index actions_id_text on actions ((id::text) text_pattern_ops)");

    this.addSql(`create table agents (
      host_id text primary key,
      last_seen timestamptz not null,
      first_seen timestamptz not null default now(),
      facts jsonb not null default '{}',
      version text not null,
      schedulable boolean not null default true
    )`);
  }
}

export const migrations = [{ name: "0001_queue", class: QueueTables }];
