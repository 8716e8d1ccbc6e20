import { Migration } from "@platform/db";

/**
 * The group lock's leases, and the slugs groups were renamed away from. A former slug stays
 * reserved to its group (only that group may take it back): rows other services still keep
 * under it, and log lines or events in flight that name it, can then only ever mean that group.
 */
export class GroupLockTables extends Migration {
  override up(): void {
    this.addSql(`create table group_leases (
      id uuid primary key,
      group_id uuid not null references groups (id) on delete cascade,
      mode text not null check (mode in ('shared', 'exclusive')),
      holder text not null,
      requested_at timestamptz not null,
      granted_at timestamptz null,
      expires_at timestamptz not null,
      check (granted_at is not null or mode = 'exclusive')
    )`);
    this.addSql("create index group_leases_group on group_leases (group_id)");
    this.addSql(`create table former_group_slugs (
      slug text primary key,
      group_id uuid not null references groups (id) on delete cascade,
      retired_at timestamptz not null default now()
    )`);
    this.addSql("create index former_group_slugs_group on former_group_slugs (group_id)");
  }
}

export const groupLockMigrations = [{ name: "0002_group_lock", class: GroupLockTables }];
