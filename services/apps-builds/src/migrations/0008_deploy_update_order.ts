import { Migration } from "@platform/db";

export class DeployUpdateOrder extends Migration {
  override up(): void {
    // When deploy-queue wrote the action update the app's deploy fields show: an older one that
    // arrives later (replicas, redeliveries) is not applied over it.
    this.addSql("alter table apps add column last_deploy_update_at timestamptz null");
  }
}

export const deployUpdateOrderMigrations = [{ name: "0008_deploy_update_order", class: DeployUpdateOrder }];
