import { Migration } from "@platform/db";

export class GroupRenames extends Migration {
  override up(): void {
    // Every slug a renamed group had, and its slug now: an event written under a slug before the
    // rename and handled after it (another durable, a backlog) is filed under the current one.
    this.addSql("create table group_renames (previous_slug text primary key, slug text not null)");
    this.addSql("create index group_renames_slug on group_renames (slug)");
  }
}

export const groupRenameMigrations = [{ name: "0003_group_renames", class: GroupRenames }];
