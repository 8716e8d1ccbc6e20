import { Migration } from "@platform/db";

export class DeploymentHistory extends Migration {
  override up(): void {
    // Immutable: one row per deployment, written in the transaction that makes it terminal.
    this.addSql(`create table deployment_history (
      id uuid primary key,
      deployment_id uuid not null unique,
      action_type text not null,
      group_slug text not null,
      app_name text not null,
      branch text not null,
      image_tag text null,
      previous_tag text null,
      status text not null,
      duration_seconds integer null,
      env_vars_snapshot jsonb not null default '{}',
      created_by text not null,
      started_at timestamptz null,
      completed_at timestamptz not null
    )`);
    this.addSql("create index deployment_history_app on deployment_history (app_name, completed_at desc)");
    this.addSql("create index actions_deployments on actions (app_name, created_at desc) where action_type in ('DEPLOY', 'RETRY', 'UNDEPLOY')");
  }
}

export const deploymentMigrations = [{ name: "0002_deployments", class: DeploymentHistory }];
