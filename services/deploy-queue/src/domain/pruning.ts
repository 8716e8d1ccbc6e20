/**
 * Pruning (spec doc 1 sections 2.5 and 8): terminal queue rows are deleted 30 days after they
 * finished. Live rows are never pruned, however old. (The consumer ledger ages out as in every
 * service: pruneLedger in @platform/bus.)
 */
import type { EntityManager } from "@platform/db";

export const RETENTION_DAYS = 30;
export const PRUNE_INTERVAL_MS = 3600_000;

export function pruneCutoff(now: Date): Date {
  return new Date(now.getTime() - RETENTION_DAYS * 24 * 3600_000);
}

export interface PruneResult {
  actions: number;
}

export async function pruneTerminal(em: EntityManager, now: Date): Promise<PruneResult> {
  const conn = em.getConnection();
  const tx = em.getTransactionContext();
  const cutoff = pruneCutoff(now);
  const actions = await conn.execute<{ id: string }[]>(
    "delete from actions where status in ('completed', 'failed', 'cancelled') and coalesce(completed_at, updated_at) < ? returning id",
    [cutoff],
    "all",
    tx,
  );
  return { actions: actions.length };
}
