import { Migration } from "@platform/db";

export class RepositoryKeyWww extends Migration {
  override up(): void {
    // The same-repository rule reads `www.github.com/acme/web` as `github.com/acme/web` now
    // (normalizeRepository); keys stored before that must say so too, or the rule misses them.
    this.addSql("update apps set repository_key = substr(repository_key, 5) where repository_key like 'www.%'");
  }
}

export const repositoryKeyWwwMigrations = [{ name: "0010_repository_key_www", class: RepositoryKeyWww }];
