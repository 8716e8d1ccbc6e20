import { Migration } from "@platform/db";

export class FirstDeploy extends Migration {
  override up(): void {
    // When the branch's first deploy completed: a seed reference is consumed by that deploy only,
    // so from then on one cannot be set (PATCH 409 already_seeded). A branch running now has had it.
    this.addSql("alter table apps add column first_deployed_at timestamptz null");
    this.addSql("update apps set first_deployed_at = running_since where running_since is not null");
  }
}

export const firstDeployMigrations = [{ name: "0009_first_deploy", class: FirstDeploy }];
