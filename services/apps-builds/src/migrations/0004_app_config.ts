import { Migration } from "@platform/db";

export class AppConfigLayers extends Migration {
  override up(): void {
    this.addSql("alter table apps add column base_config jsonb null");
    this.addSql("alter table apps add column overlay jsonb not null default '{}'");
    this.addSql("alter table apps add column seed_from_reference text null");
  }
}

export const configMigrations = [{ name: "0004_app_config", class: AppConfigLayers }];
