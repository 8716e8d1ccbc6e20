import { Migration } from "@platform/db";

export class CloneDataColumn extends Migration {
  override up(): void {
    // `{source_branch, components: {db, drives, buckets}}`: restored on the first deploy.
    this.addSql("alter table apps add column clone_data jsonb null");
  }
}

export const cloneDataMigrations = [{ name: "0006_clone_data", class: CloneDataColumn }];
