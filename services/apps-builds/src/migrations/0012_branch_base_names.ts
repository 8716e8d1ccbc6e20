import { Migration } from "@platform/db";

export class BranchBaseNames extends Migration {
  override up(): void {
    // A branch registered under the app's suffixed name (`web-2`) got that as its base name, so
    // a request naming the app as first registered (`web`) did not find the branch. Every branch
    // now keeps the base name of the app's first registration.
    this.addSql(`update apps a set base_name = f.base_name
      from (select distinct on (app_name) app_name, base_name from apps order by app_name, created_at, id) f
      where a.app_name = f.app_name and a.base_name <> f.base_name`);
  }
}

export const branchBaseNamesMigrations = [{ name: "0012_branch_base_names", class: BranchBaseNames }];
