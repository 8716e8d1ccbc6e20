/** The audit log of apps-builds (the same shape as identity's). */
import type { EntityManager } from "@platform/db";
import { AuditEntry } from "../entities/variables.ts";


/** Adds an audit row to the transaction of `em`: it commits or rolls back with the change itself. */
export function audit(
  em: EntityManager,
  entry: { actor: string; action: string; target: string; groupSlug?: string | null; details?: Record<string, unknown> },
): void {
  em.create(AuditEntry, {
    actor: entry.actor,
    action: entry.action,
    target: entry.target,
    groupSlug: entry.groupSlug ?? null,
    details: entry.details ?? {},
  });
}
