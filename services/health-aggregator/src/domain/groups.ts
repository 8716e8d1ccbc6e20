/**
 * Groups renamed or deleted in identity. Stored log lines, and the side tables ingestion keeps of
 * them (log_builds, log_groups), carry the group owning the app: who may read them.
 * A rename moves them to the new slug; a deletion drops them, since its lines must never reach a
 * new group that takes one of its slugs. Both are idempotent.
 */
import type { EntityManager } from "@platform/db";

const TABLES = ["log_lines", "log_builds", "log_groups"] as const;

export async function rekeyGroup(em: EntityManager, from: string, to: string): Promise<void> {
  if (from === to) return;
  for (const table of TABLES) {
    await em.getConnection().execute(`update ${table} set group_slug = ? where group_slug = ?`, [to, from], "run", em.getTransactionContext());
  }
}

export async function forgetGroup(em: EntityManager, slugs: readonly string[]): Promise<void> {
  if (slugs.length === 0) return;
  for (const table of TABLES) {
    await em.getConnection().execute(`delete from ${table} where group_slug in (?)`, [slugs], "run", em.getTransactionContext());
  }
}
