/**
 * Builds going away: a branch deleted (DELETE /api/apps/{app}) or its builds purged by an undeploy
 * with `purge` (spec doc 1 section 4.5). What other services keep of them goes too, told by
 * `builds_deleted` through the outbox: health-aggregator drops their log lines, so that a build
 * no longer counts among an app's most recent, and a branch registered again under the same name
 * starts without the old one's lines; deploy-queue drops a deleted branch's deployments, history
 * and queue actions.
 */
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { Build, type App } from "../entities/index.ts";

/** Announces the branch's builds as deleted; read before their rows go. */
export async function announceBuildsDeleted(em: EntityManager, app: Pick<App, "id" | "groupSlug" | "appName" | "branch">, branchDeleted: boolean): Promise<void> {
  const builds = await em.find(Build, { appId: app.id }, { fields: ["id"] });
  enqueueEvent(em, subjects.events.buildsDeleted, {
    group_slug: app.groupSlug,
    app_name: app.appName,
    branch: app.branch,
    build_ids: builds.map((b) => b.id),
    branch_deleted: branchDeleted,
    deleted_at: new Date().toISOString(),
  });
}
