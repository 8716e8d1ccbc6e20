import type { EntityManager } from "@platform/db";

/**
 * Transaction-scoped advisory locks, taken in the order given, in one round trip; the commit or
 * rollback releases them. Keys are namespaced (`deploy_queue.<what>.<target>`): advisory locks
 * are database-wide. Two keys that hash alike only wait for each other, which is harmless.
 */
export async function advisoryLocks(em: EntityManager, keys: string[]): Promise<void> {
  const locks = keys.map(() => "pg_advisory_xact_lock(hashtext(?))").join(", ");
  await em.getConnection().execute(`select ${locks}`, keys, "run", em.getTransactionContext());
}
