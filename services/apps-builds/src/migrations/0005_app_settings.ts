import { Migration } from "@platform/db";

/**
 * App settings set at registration or by PATCH (spec doc 1 section 4.4): the deploy config object
 * and the services and containers lists, each stored as the client sent it.
 */
export class AppSettings extends Migration {
  override up(): void {
    this.addSql("alter table apps add column deploy_config jsonb null");
    this.addSql("alter table apps add column deploy_services jsonb null");
    this.addSql("alter table apps add column deploy_containers jsonb null");
  }
}

export const settingsMigrations = [{ name: "0005_app_settings", class: AppSettings }];
