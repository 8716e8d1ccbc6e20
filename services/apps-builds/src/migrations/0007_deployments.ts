import { Migration } from "@platform/db";

export class DeploymentColumns extends Migration {
  override up(): void {
    // The repository config of the commit each build read: what a deploy of its tag runs.
    this.addSql("alter table builds add column config jsonb null");
    this.addSql("alter table apps add column last_deploy_action_id uuid null");
    this.addSql("alter table apps add column last_deploy_status text null");
    this.addSql("alter table apps add column last_deploy_error text null");
    this.addSql("alter table apps add column last_crash_output jsonb null");
    this.addSql("alter table apps add column primary_overrides jsonb not null default '{}'");
  }
}

export const deploymentMigrations = [{ name: "0007_deployments", class: DeploymentColumns }];
