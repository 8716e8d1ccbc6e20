/**
 * The audit log a service keeps in its own schema (table `audit_log`, created by the service's
 * migrations): who did what, written in the transaction of the change itself.
 */
import { defineEntity, p } from "@mikro-orm/core";
import type { EntityManager } from "@mikro-orm/postgresql";

export const AuditEntrySchema = defineEntity({
  name: "AuditEntry",
  tableName: "audit_log",
  properties: {
    id: p.bigint().primary().autoincrement(),
    at: p.datetime().defaultRaw("now()"),
    /** Who did it: `<caller kind>:<principal id>` (`api_key:<id>`, `session:<id>`) or `system`. */
    actor: p.text(),
    action: p.text(),
    target: p.text(),
    groupSlug: p.text().nullable(),
    details: p.json<Record<string, unknown>>(),
  },
});
export class AuditEntry extends AuditEntrySchema.class {}
AuditEntrySchema.setClass(AuditEntry);

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
