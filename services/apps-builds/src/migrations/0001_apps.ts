import { Migration } from "@platform/db";

export class AppsTable extends Migration {
  override up(): void {
    this.addSql(`create table apps (
      id uuid primary key,
      app_name text not null,
      base_name text not null,
      display_name text not null,
      slug text not null,
      group_slug text not null,
      branch text not null,
      branch_label text not null,
      repository text not null,
      repository_key text not null,
      config_path text not null,
      description text not null default '',
      deploy_status text not null,
      visibility text not null check (visibility in ('public', 'private')),
      is_production boolean not null,
      latest_build text null,
      build_count integer not null default 0,
      running_version text null,
      running_build_id uuid null,
      running_since timestamptz null,
      database_enabled boolean not null default false,
      cache_enabled boolean not null default false,
      email_enabled boolean not null default false,
      preflight_status text not null check (preflight_status in ('pending', 'no_access', 'needs_config', 'config_invalid', 'ready', 'exempt')),
      preflight_result jsonb null,
      preflight_nonce integer not null default 0,
      service_names jsonb not null default '[]',
      warnings jsonb not null default '[]',
      deploy_warning text null,
      created_by text not null,
      created_at timestamptz not null default now(),
      updated_at timestamptz not null default now(),
      unique (app_name, branch),
      unique (app_name, branch_label)
    )`);
    this.addSql("create index apps_group on apps (group_slug, app_name)");
    this.addSql("create index apps_repository on apps (group_slug, repository_key, config_path)");
    // One production branch per app.
    this.addSql("create unique index apps_one_production on apps (app_name) where is_production");
  }
}

export const migrations = [{ name: "0001_apps", class: AppsTable }];
