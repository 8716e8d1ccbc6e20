/**
 * Groups renamed or deleted in identity. Queue actions (and the work description in their
 * payload) and deployment history carry the slug of the group owning the app: a rename moves them
 * to the new slug; a deletion drops them, since the group owned no apps any more and its history
 * must never reach a new group that takes one of its slugs. Both are idempotent. A rename is also
 * remembered (group_renames), for events that still carry an earlier slug.
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
  // Remembered, with every earlier slug of the group following along (A -> B, then B -> C: A is C).
  await conn.execute("update group_renames set slug = ? where slug = ?", [to, from], "run", tx);
  await conn.execute(
    "insert into group_renames (previous_slug, slug) values (?, ?) on conflict (previous_slug) do update set slug = excluded.slug",
    [from, to],
    "run",
    tx,
  );
  await conn.execute("delete from group_renames where previous_slug = ?", [to], "run", tx);
}

/**
 * The slug each of `slugs` goes by now: an event written before a rename (a build requested just
 * then, handled after deploy-queue re-keyed the group) files its action under the group's current
 * slug, not under one nothing will move again.
 */
export async function currentSlugs(em: EntityManager, slugs: readonly string[]): Promise<Map<string, string>> {
  const unique = [...new Set(slugs)];
  if (unique.length === 0) return new Map();
  const rows = await em
    .getConnection()
    .execute<{ previous_slug: string; slug: string }[]>("select previous_slug, slug from group_renames where previous_slug in (?)", [unique], "all", em.getTransactionContext());
  return new Map(rows.map((r) => [r.previous_slug, r.slug]));
}

export async function forgetGroup(em: EntityManager, slugs: readonly string[]): Promise<void> {
  if (slugs.length === 0) return;
  const conn = em.getConnection();
  const tx = em.getTransactionContext();
  await conn.execute("delete from deployment_history where group_slug in (?)", [slugs], "run", tx);
  await conn.execute("delete from actions where group_slug in (?)", [slugs], "run", tx);
  // A slug freed by the deletion may be taken by a new group: it must not be renamed away.
  await conn.execute("delete from group_renames where slug in (?) or previous_slug in (?)", [slugs, slugs], "run", tx);
}
