/**
 * Groups renamed or deleted in identity. Queue actions (and the work description in their
 * payload) and deployment history carry the slug of the group owning the app: a rename moves them
 * to the new slug; a deletion drops them, since the group owned no apps any more and its history
 * must never reach a new group that takes one of its slugs. Both are idempotent.
 */
import type { EntityManager } from "@platform/db";

export async function rekeyGroup(em: EntityManager, from: string, to: string): Promise<void> {
  if (from === to) return;
  const conn = em.getConnection();
  const tx = em.getTransactionContext();
  await conn.execute(
    `update actions set group_slug = ?,
       payload = case when payload->>'group_slug' is null then payload else jsonb_set(payload, '{group_slug}', to_jsonb(?::text)) end
     where group_slug = ?`,
    [to, to, from],
    "run",
    tx,
  );
  await conn.execute("update deployment_history set group_slug = ? where group_slug = ?", [to, from], "run", tx);
}

export async function forgetGroup(em: EntityManager, slugs: readonly string[]): Promise<void> {
  if (slugs.length === 0) return;
  const conn = em.getConnection();
  const tx = em.getTransactionContext();
  await conn.execute("delete from deployment_history where group_slug in (?)", [slugs], "run", tx);
  await conn.execute("delete from actions where group_slug in (?)", [slugs], "run", tx);
}
