import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { Action, AppsBuildsService, Build, DeployQueueService, HealthAggregatorService } from "@platform/proto";
import { PlatformError } from "@platform/errors";
import { platformErrorOf } from "@platform/rpc";
import { spansEveryGroup } from "@platform/caller";
import { LIVE_TAIL_LIMIT, fromBuild, fromQueue, showsShippedLines } from "../domain/build-log.ts";
import { callerOf } from "../access.ts";
import { groupLockErrors, authErrors, bodyErrors, commonQuery, offsetParam } from "../schemas.ts";

const orNull = <T>(v: T | undefined) => (v === undefined || v === "" ? null : v);

export function buildJson(b: Build) {
  return {
    id: b.id,
    app_name: b.appName,
    display_name: b.displayName,
    tag: b.tag,
    commit_hash: orNull(b.commitHash),
    commit_message: orNull(b.commitMessage),
    commit_author: orNull(b.commitAuthor),
    commit_committed_at: orNull(b.commitCommittedAt),
    branch: b.branch,
    status: b.status,
    queue_status: b.queueStatus,
    codebuild_id: b.codebuildId,
    codebuild_phase: b.codebuildPhase,
    duration_seconds: b.durationSeconds ?? 0,
    images: b.images,
    error_message: orNull(b.errorMessage),
    created_by: b.createdBy,
    started_at: orNull(b.startedAt),
    completed_at: orNull(b.completedAt),
    created_at: b.createdAt,
    updated_at: b.updatedAt,
  };
}

const nullable = { type: ["string", "null"] } as const;
const buildSchema = {
  type: "object",
  properties: {
    id: { type: "string" },
    app_name: { type: "string" },
    display_name: { type: "string" },
    tag: { type: "string", description: "`{branch}-{hash}`, unique per app; the branch as its hostname label (`feature/x` builds `feature-x-<hash>`)." },
    commit_hash: nullable,
    commit_message: nullable,
    commit_author: nullable,
    commit_committed_at: nullable,
    branch: { type: "string" },
    status: { type: "string", enum: ["pending", "queued", "in_progress", "completed", "failed", "cancelled"], description: "Stays `queued` while the build runs; final at completion." },
    queue_status: { type: "string", description: "Live lifecycle: queued, build_in_progress, build_completed, build_failed, build_cancelled." },
    codebuild_id: { type: "string" },
    codebuild_phase: { type: "string", enum: ["SUBMITTED", "PROVISIONING", "BUILD", "COMPLETED"] },
    duration_seconds: { type: "integer", description: "Whole seconds the build has run: final once it ended, so far while it runs, 0 before an agent takes it." },
    images: { type: "array", items: { type: "string" } },
    error_message: nullable,
    created_by: { type: "string" },
    started_at: nullable,
    completed_at: nullable,
    created_at: { type: "string" },
    updated_at: { type: "string" },
  },
} as const;

const buildIdParams = {
  type: "object",
  properties: { build_id: { type: "string", description: "The id or a prefix of at least 8 hex-or-hyphen characters." } },
  required: ["build_id"],
} as const;

export function buildRoutes(
  app: FastifyInstance,
  apps: Client<typeof AppsBuildsService>,
  queue: Client<typeof DeployQueueService>,
  health: Client<typeof HealthAggregatorService>,
): void {
  app.post(
    "/api/builds",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["builds"],
        summary: "Trigger a build (and, with auto_deploy, its deploy). An unknown app is registered in your group.",
        description:
          "The builds row (GET /api/builds/id/{build_id}) exists when the 202 is sent. The queue takes the build in an instant later: for those few " +
          "milliseconds GET /api/deployments/queue does not list it yet and queue/{id} answers 404; a cancel by build id already works.",
        querystring: {
          type: "object",
          properties: { ...commonQuery, skip_preflight: { type: "boolean", default: false, description: "Bypass the repository preflight gate." } },
        },
        body: {
          type: "object",
          properties: {
            app_name: { type: "string", minLength: 1, maxLength: 128 },
            repository: { type: "string" },
            branch: { type: "string", minLength: 1, default: "main" },
            auto_deploy: {
              type: "boolean",
              default: true,
              description:
                "Deploy the build once it completes. Builds can finish out of order: the deploy of a build ends cancelled (superseded) " +
                "when the deploy of a build of the same app and branch requested after it has already started, so the newest request wins.",
            },
            config_path: {
              type: "string",
              description:
                "Default platform.yaml, for an app this build registers. A registered app builds with its own config path; one sent that differs is 409 " +
                "`config_path_mismatch` (change it with PATCH /api/apps/{app_name}).",
            },
          },
          required: ["app_name", "repository"],
        },
        response: {
          202: {
            type: "object",
            properties: {
              tag: { type: "string" },
              action_id: { type: "string", description: "Equals build_id." },
              status: { type: "string", enum: ["queued"] },
              build_id: { type: "string" },
              app_name: { type: "string", description: "The app built. The name asked for may be the base name of an app registered with a numeric suffix (`shop` builds `shop-2`): read its builds and state under this name." },
            },
            required: ["tag", "action_id", "status", "build_id", "app_name"],
          },
          ...authErrors,
          ...bodyErrors,
          422: {
            $ref: "Error#",
            description:
              "Validation failed; for an app this build registers, every 422 of POST /api/apps (`repository_host_unsupported`, `label_too_long`, a config_path or repository too long); " +
              "and for a platform operator who names no group (?group=), an app registered nowhere yet: the group to register it in must be named. " +
              "An operator who names none builds a registered app in the group that has it.",
          },
          ...groupLockErrors(
            "`preflight_quarantined` (with remediation text; with `registered: true` when this request registered the app, which stays registered while its repository check runs), " +
              "`repository_mismatch`, `config_path_mismatch`; for an app this build registers, every 409 of POST /api/apps (`repository_already_registered`, `branch_collides`, `host_label_taken`); " +
              "`app_in_several_groups` for an operator who names no group",
          ),
        },
      },
    },
    async (request, reply) => {
      const b = request.body as { app_name: string; repository: string; branch?: string; auto_deploy?: boolean; config_path?: string };
      const { skip_preflight } = request.query as { skip_preflight?: boolean };
      const r = await apps.triggerBuild({
        caller: callerOf(request),
        appName: b.app_name,
        repository: b.repository,
        branch: b.branch ?? "main",
        autoDeploy: b.auto_deploy ?? true,
        configPath: b.config_path ?? "",
        skipPreflight: skip_preflight ?? false,
      });
      return reply.code(202).send({ tag: r.tag, action_id: r.actionId, status: r.status, build_id: r.buildId, app_name: r.appName });
    },
  );

  app.get(
    "/api/builds",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["builds"],
        summary: "Builds, newest first; without app_name, every app of the group you act in.",
        querystring: {
          type: "object",
          properties: {
            ...commonQuery,
            app_name: { type: "string" },
            branch: { type: "string", description: "Omit to span branches." },
            since: { type: "string", description: "ISO 8601 date or timestamp (e.g. 2026-11-24 or 2026-11-24T09:30:00Z); without an offset, UTC." },
            limit: { type: "integer", minimum: 1, maximum: 200, default: 50 },
            offset: offsetParam,
          },
        },
        response: {
          200: { type: "object", properties: { items: { type: "array", items: buildSchema }, total: { type: "integer" } }, required: ["items", "total"] },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const q = request.query as { app_name?: string; branch?: string; since?: string; limit: number; offset: number };
      const r = await apps.listBuilds({
        caller: callerOf(request),
        appName: q.app_name ?? "",
        branch: q.branch ?? "",
        since: q.since ?? "",
        limit: q.limit,
        offset: q.offset,
      });
      return { items: r.items.map(buildJson), total: r.total };
    },
  );

  app.get(
    "/api/builds/id/:build_id",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["builds"],
        summary: "One build by id or id prefix (at least 8 hex-or-hyphen characters; shorter or malformed: 422).",
        params: buildIdParams,
        querystring: { type: "object", properties: commonQuery },
        response: { 200: buildSchema, ...authErrors },
      },
    },
    async (request) => {
      const { build_id } = request.params as { build_id: string };
      return buildJson(await apps.getBuild({ caller: callerOf(request), buildId: build_id }));
    },
  );

  app.get(
    "/api/builds/id/:build_id/logs",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["builds"],
        summary: "The build's log (doc 1 section 2.3): stored at completion; a live tail while it runs; synthesised from the queue (source: queue) when no builds row exists.",
        params: buildIdParams,
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: {
              build_id: { type: "string" },
              app_name: { type: "string" },
              tag: { type: "string" },
              status: { type: "string" },
              queue_status: nullable,
              message: nullable,
              log: { type: "string" },
              lines: { type: "integer" },
              source: { type: "string", enum: ["queue"], description: "Present only when synthesised from the queue." },
            },
            required: ["build_id", "app_name", "tag", "status", "queue_status", "message", "log", "lines"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { build_id } = request.params as { build_id: string };
      const caller = callerOf(request);
      let build: Build;
      try {
        build = await apps.getBuild({ caller, buildId: build_id });
      } catch (err) {
        if (platformErrorOf(err)?.status !== 404) throw err;
        // No builds row: the queue may still know the action (a build that failed before its record).
        const missing = () => PlatformError.notFound(`No build and no BUILD queue action matches '${build_id}'`);
        let action: Action;
        try {
          action = await queue.getAction({ caller, actionId: build_id });
        } catch (queueErr) {
          if (platformErrorOf(queueErr)?.status !== 404) throw queueErr;
          throw missing();
        }
        // Only a BUILD stands in for a build, and only where the builds row was looked for.
        const searched = spansEveryGroup(caller) || action.groupSlug === caller.selectedGroup;
        if (action.actionType !== "BUILD" || !searched) throw missing();
        return fromQueue(action);
      }
      if (!showsShippedLines(build)) return fromBuild(build, null);
      try {
        const tail = await health.queryLogs({ caller, buildId: build.id, source: "build", since: "7d", limit: LIVE_TAIL_LIMIT });
        return fromBuild(build, tail.error ? null : { rows: tail.logs, more: tail.hasMore });
      } catch {
        return fromBuild(build, null);
      }
    },
  );

  app.get(
    "/api/builds/:app_name/:tag",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["builds"],
        summary: "One build by app and tag.",
        params: { type: "object", properties: { app_name: { type: "string" }, tag: { type: "string" } }, required: ["app_name", "tag"] },
        querystring: { type: "object", properties: commonQuery },
        response: { 200: buildSchema, ...authErrors },
      },
    },
    async (request) => {
      const { app_name, tag } = request.params as { app_name: string; tag: string };
      return buildJson(await apps.getBuildByTag({ caller: callerOf(request), appName: app_name, tag }));
    },
  );
}
