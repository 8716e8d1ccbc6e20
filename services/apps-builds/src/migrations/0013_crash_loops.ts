import { Migration } from "@platform/db";

export class CrashLoops extends Migration {
  override up(): void {
    // The branch's replicas an agent says are crash-looping (domain/crash-loops.ts).
    this.addSql("alter table apps add column crash_loops jsonb not null default '{}'");
  }
}

export const crashLoopsMigrations = [{ name: "0013_crash_loops", class: CrashLoops }];
