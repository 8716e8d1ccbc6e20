/**
 * A group renamed in identity (`group_renamed`): apps and builds carry the slug of the group that
 * owns them, so they follow it. Variables, config layers and the rest hang off the app's id.
 * Idempotent: once re-keyed, nothing is left under the old slug.
 */
import type { EntityManager } from "@platform/db";

/** Moves the rows under any of `from` (slugs the group had) to its slug `to`. */
export async function rekeyGroup(em: EntityManager, from: readonly string[], to: string): Promise<void> {
  const old = from.filter((slug) => slug !== to);
  if (old.length === 0) return;
  const conn = em.getConnection();
  const tx = em.getTransactionContext();
  await conn.execute("update apps set group_slug = ? where group_slug in (?)", [to, old], "run", tx);
  await conn.execute("update builds set group_slug = ? where group_slug in (?)", [to, old], "run", tx);
}
