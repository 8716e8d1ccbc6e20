/**
 * Groups renamed or deleted in identity. Stored log lines, and the side tables ingestion keeps of
 * them (log_builds, log_groups), carry the group owning the app: who may read them.
 * A rename moves them to the new slug; a deletion drops them, since its lines must never reach a
 * new group that takes one of its slugs. Lines still on their way follow (forgetting.ts). Both
 * are idempotent.
 */
import type { EntityManager } from "@platform/db";
import { holdForgetting } from "./forgetting.ts";

const TABLES = ["log_lines", "log_builds", "log_groups"] as const;

function runner(em: EntityManager) {
  return (sql: string, params: unknown[]) => em.getConnection().execute(sql, params, "run", em.getTransactionContext());
}

export async function rekeyGroup(em: EntityManager, from: string, to: string): Promise<void> {
  if (from === to) return;
  await holdForgetting(em);
  const run = runner(em);
  for (const table of TABLES) await run(`update ${table} set group_slug = ? where group_slug = ?`, [to, from]);
  await run(
    `insert into log_forgotten_branches (group_slug, app_name, branch, forgotten_at)
     select ?, app_name, branch, forgotten_at from log_forgotten_branches where group_slug = ?
     on conflict (group_slug, app_name, branch) do update set forgotten_at = greatest(log_forgotten_branches.forgotten_at, excluded.forgotten_at)`,
    [to, from],
  );
  await run("delete from log_forgotten_branches where group_slug = ?", [from]);
  // Renamed back to a slug it had: lines under that slug are stored under it again.
  await run("delete from log_group_renames where previous_slug = ?", [to]);
  await run("update log_group_renames set slug = ? where slug = ?", [to, from]);
  await run("insert into log_group_renames (previous_slug, slug) values (?, ?) on conflict (previous_slug) do update set slug = excluded.slug", [from, to]);
}

/** `at`: when the group was deleted; lines written before it under one of its slugs are forgotten. */
export async function forgetGroup(em: EntityManager, slugs: readonly string[], at: Date): Promise<void> {
  if (slugs.length === 0) return;
  await holdForgetting(em);
  const run = runner(em);
  for (const table of TABLES) await run(`delete from ${table} where group_slug in (?)`, [slugs]);
  await run("delete from log_forgotten_branches where group_slug in (?)", [slugs]);
  await run("delete from log_group_renames where slug in (?) or previous_slug in (?)", [slugs, slugs]);
  for (const slug of slugs) {
    await run(
      `insert into log_forgotten_groups (slug, forgotten_at) values (?, ?)
       on conflict (slug) do update set forgotten_at = greatest(log_forgotten_groups.forgotten_at, excluded.forgotten_at)`,
      [slug, at],
    );
  }
}
