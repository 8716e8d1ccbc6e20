/**
 * Forgetting: a build, a branch or a group deleted takes its log lines with it, and a group
 * renamed takes them to its new slug. Lines still on their way (an agent ships in batches; the
 * LOGS stream redelivers what was not acknowledged) must not bring them back. So what was
 * forgotten is kept (migration 0006) and ingestion checks each line against it:
 *
 * - a line of a deleted build is dropped;
 * - a line of a deleted branch, or of a slug a deleted group had, is dropped when it was written
 *   before the deletion (a branch or group created again under the name afterwards has its own);
 * - a line under a slug a group was renamed away from is stored under the group's slug now (the
 *   old slug stays reserved to the group, so every line under it is the group's).
 *
 * The check and the forgetting exclude each other through one advisory lock: ingestion holds it
 * shared while its batch commits, forgetting holds it alone. Forgetting therefore sees every
 * batch that did not see it, and deletes that batch's lines.
 *
 * Kept for LOG_RETENTION_DAYS, like the lines (retention.ts): a line older than that is deleted
 * by retention anyway. Renames are kept until their group is deleted.
 */
import type { EntityManager } from "@platform/db";

const LOCK_KEY = "hashtext(current_schema() || '.log-forgetting')";

/** Taken by ingestion, in the transaction of its batch, before the batch's statement. */
export const FORGETTING_SHARED_LOCK = `select pg_advisory_xact_lock_shared(${LOCK_KEY})`;

/** Taken by every forgetting, first in its transaction. */
export async function holdForgetting(em: EntityManager): Promise<void> {
  await em.getConnection().execute(`select pg_advisory_xact_lock(${LOCK_KEY})`, [], "all", em.getTransactionContext());
}

/**
 * The lines of a batch (the `raw` rows of the ingestion statement) that are not forgotten, each
 * under its group's slug now: the `input` of log-store.ts's INSERT.
 */
export const UNFORGOTTEN_LINES = `
  select r.line_id, r.ts, r.source, r.level, r.app_name, r.branch, coalesce(m.slug, r.group_slug) as group_slug, r.service_name,
    r.deployment_id, r.build_id, r.action_id, r.instance_id, r.message, r.metadata
  from raw r left join log_group_renames m on m.previous_slug = r.group_slug
  where not exists (select 1 from log_forgotten_builds f where f.build_id = r.build_id)
    and not exists (select 1 from log_forgotten_groups g where g.slug = r.group_slug and r.ts <= g.forgotten_at)
    and not exists (
      select 1 from log_forgotten_branches b
      where b.group_slug = coalesce(m.slug, r.group_slug) and b.app_name = r.app_name and b.branch = r.branch and r.ts <= b.forgotten_at
    )`;

/** The tombstones older than the retention's cutoff. */
export const PRUNE_TOMBSTONES = [
  "delete from log_forgotten_builds where forgotten_at < $1",
  "delete from log_forgotten_branches where forgotten_at < $1",
  "delete from log_forgotten_groups where forgotten_at < $1",
];
