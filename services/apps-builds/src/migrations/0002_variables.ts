import { Migration } from "@platform/db";

/**
 * Environment variables per app branch (doc 2 section 4.6) and the service's audit log.
 * `variable_sets` holds one row per branch that has ever had variables written: its updated_at
 * is the `destination_updated_at` a copy-preview returns and a copy compares, so it is kept at
 * millisecond precision (what an ISO string carries) and only ever moves forward.
 */
export class VariablesTables extends Migration {
  override up(): void {
    this.addSql(`create table variables (
      app_id uuid not null references apps (id) on delete cascade deferrable initially deferred,
      key text not null,
      value text not null,
      updated_at timestamptz(3) not null,
      primary key (app_id, key)
    )`);
    this.addSql(`create table variable_sets (
      app_id uuid primary key references apps (id) on delete cascade deferrable initially deferred,
      updated_at timestamptz(3) not null,
      updated_by text not null
    )`);
    this.addSql(`create table audit_log (
      id bigserial primary key,
      at timestamptz not null default now(),
      actor text not null,
      action text not null,
      target text not null,
      group_slug text null,
      details jsonb not null default '{}'
    )`);
    this.addSql("create index audit_log_at on audit_log (at)");
  }
}

export const variableMigrations = [{ name: "0002_variables", class: VariablesTables }];
