import { Migration } from "@platform/db";

export class RunningMounts extends Migration {
  override up(): void {
    // The routing shape of the release serving now (service -> mount, null for an unrouted one),
    // as the agent reported it on completing the deploy. Null for a release deployed before this
    // column: its URLs come from the app's config as they did.
    this.addSql("alter table apps add column running_mounts jsonb null");
  }
}

export const runningMountsMigrations = [{ name: "0011_running_mounts", class: RunningMounts }];
