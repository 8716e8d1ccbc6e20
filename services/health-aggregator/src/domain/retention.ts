/**
 * Log retention. Every line an agent ships (builds, deploys, every replica's stdout and stderr)
 * is stored, and nothing removed them: the log store grew with every request an app logged. Lines
 * older than LOG_RETENTION_DAYS (default 30, the queue's own retention) are deleted every hour, a
 * batch at a time so that ingestion and queries never wait long behind the delete; a build whose
 * every line has gone leaves log_builds with them. (A build's own log stays on its build record.)
 */
export const LOG_PRUNE_INTERVAL_MS = 3600_000;
/** Lines deleted per statement. */
export const LOG_PRUNE_BATCH = 5_000;

export function logRetentionCutoff(now: Date, retentionDays: number): Date {
  return new Date(now.getTime() - retentionDays * 24 * 3600_000);
}

/** One batch of lines older than the cutoff, oldest first. */
export const PRUNE_LINES = `delete from log_lines where id in (
  select id from log_lines where ts < $1 order by ts limit $2
)`;

/** The builds whose last line is older than the cutoff: their lines are gone, or going. */
export const PRUNE_BUILDS = "delete from log_builds where last_ts < $1";
