import { Migration } from "@platform/db";

export class IdentityTables extends Migration {
  override up(): void {
    this.addSql(`create table groups (
      id uuid primary key,
      slug text not null unique,
      display_name text not null,
      personal boolean not null default false,
      created_at timestamptz not null default now()
    )`);
    this.addSql(`create table users (
      id uuid primary key,
      email text not null unique,
      display_name text not null,
      platform_admin boolean not null default false,
      disabled boolean not null default false,
      email_verified boolean not null default false,
      personal_group_id uuid null references groups (id) deferrable initially deferred,
      created_at timestamptz not null default now()
    )`);
    this.addSql(`create table memberships (
      user_id uuid not null references users (id) on delete cascade deferrable initially deferred,
      group_id uuid not null references groups (id) on delete cascade deferrable initially deferred,
      role text not null check (role in ('owner', 'admin', 'deployer', 'viewer')),
      created_at timestamptz not null default now(),
      primary key (user_id, group_id)
    )`);
    this.addSql(`create table api_keys (
      id uuid primary key,
      prefix text not null,
      hash text not null unique,
      name text not null,
      scope text not null check (scope in ('read', 'deploy', 'admin')),
      kind text not null check (kind in ('group', 'platform', 'root')),
      group_id uuid null references groups (id) on delete cascade deferrable initially deferred,
      created_by text not null,
      created_at timestamptz not null default now(),
      last_used_at timestamptz null,
      revoked_at timestamptz null,
      check ((kind = 'group') = (group_id is not null))
    )`);
    this.addSql("create index api_keys_group on api_keys (group_id)");
    // One live root key per environment; rotation revokes the old one in the same transaction.
    this.addSql("create unique index api_keys_one_live_root on api_keys (kind) where kind = 'root' and revoked_at is null");
    this.addSql(`create table sessions (
      id uuid primary key,
      token_hash text not null unique,
      user_id uuid not null references users (id) on delete cascade deferrable initially deferred,
      kind text not null check (kind in ('browser', 'cli')),
      created_at timestamptz not null default now(),
      last_used_at timestamptz null,
      idle_expires_at timestamptz not null,
      absolute_max_at timestamptz not null,
      revoked_at timestamptz null
    )`);
    this.addSql("create index sessions_user on sessions (user_id)");
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

export const migrations = [{ name: "0001_identity", class: IdentityTables }];
