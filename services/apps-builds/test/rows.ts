/**
 * Rows of apps-builds as a test sets them up directly: a build that completed, for an app row the
 * test registered (its deploy state, a release to resolve, a tag to scale or retry).
 */
import { randomUUID } from "node:crypto";
import type { EntityManager } from "@platform/db";
import { Build, type App } from "../src/entities/index.ts";

/** Writes (in `em`'s unit of work) a completed build of `app` tagged `tag`; answers its id. */
export function completedBuild(em: EntityManager, app: App, tag: string, config: Record<string, unknown> | null = null): string {
  const id = randomUUID();
  em.create(Build, {
    id,
    appId: app.id,
    appName: app.appName,
    displayName: app.displayName,
    groupSlug: app.groupSlug,
    branch: app.branch,
    tag,
    status: "completed",
    queueStatus: "build_completed",
    codebuildPhase: "COMPLETED",
    images: [],
    autoDeploy: true,
    createdBy: "api_key:k",
    config,
  });
  return id;
}
