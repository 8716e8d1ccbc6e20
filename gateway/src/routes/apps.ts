import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import { fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { ListValueSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { REGISTRATION_SETTINGS, type App, type AppsBuildsService, type DeployQueueService } from "@platform/proto";
import { callerOf, requireScopeInNamedGroup } from "../access.ts";
import { shownRepository } from "@platform/app-config";
import { PlatformError } from "@platform/errors";
import { groupLockErrors, authErrors, bodyErrors, commonQuery } from "../schemas.ts";
import { NOT_HOLDING_DELETION, refuseDeletionDuringAction } from "../domain/deletion.ts";

const orNull = <T>(v: T | undefined) => (v === undefined || v === "" ? null : v);

/** The spec's app shape (doc 1 section 2.1); `single` adds the single-app fields. */
export function appJson(a: App, single: boolean) {
  const base = {
    id: a.id,
    app_name: a.appName,
    display_name: a.displayName,
    slug: a.slug,
    group_slug: a.groupSlug,
    branch: a.branch,
    repository: shownRepository(a.repository),
    config_path: a.configPath,
    description: a.description,
    deploy_status: a.deployStatus,
    visibility: a.visibility,
    is_production: a.isProduction,
    latest_build: orNull(a.latestBuild),
    build_count: a.buildCount,
    running_version: orNull(a.runningVersion),
    running_build_id: orNull(a.runningBuildId),
    running_since: orNull(a.runningSince),
    // Rebuilt by apps-builds from the routing shape on every read.
    urls: a.urls,
    services: a.services.map((s) => ({ name: s.name, url: s.url ?? null })),
    database_enabled: a.databaseEnabled,
    cache_enabled: a.cacheEnabled,
    email_enabled: a.emailEnabled,
    preflight_status: a.preflightStatus,
    preflight_result: a.preflightResult
      ? {
          reason: a.preflightResult.reason,
          detail: a.preflightResult.detail,
          services: a.preflightResult.services,
          missing_paths: a.preflightResult.missingPaths,
          errors: a.preflightResult.errors ? toJson(ListValueSchema, a.preflightResult.errors) : [],
        }
      : null,
    deploy_warning: orNull(a.deployWarning),
    warnings: a.warnings,
    created_by: a.createdBy,
    created_at: a.createdAt,
    updated_at: a.updatedAt,
  };
  if (!single) return base;
  return {
    ...base,
    last_deploy_status: orNull(a.lastDeployStatus),
    last_deploy_error: orNull(a.lastDeployError),
    last_crash_output: a.lastCrashOutputJson ? (JSON.parse(a.lastCrashOutputJson) as Record<string, string[]>) : null,
    last_build_status: orNull(a.lastBuildStatus),
    last_build_error: orNull(a.lastBuildError),
  };
}

const appName = { type: "object", properties: { app_name: { type: "string" } }, required: ["app_name"] } as const;
const branchQuery = {
  type: "object",
  properties: { ...commonQuery, branch: { type: "string", description: "Branch of the app; defaults to the production branch." } },
} as const;
const appResponse = { $ref: "App#" } as const;

export function appRoutes(app: FastifyInstance, apps: Client<typeof AppsBuildsService>, queue: Client<typeof DeployQueueService>, env: { domain: string; environment: string }): void {
  app.post(
    "/api/apps",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["apps"],
        summary: "Register an app from a git repository. It starts quarantined at preflight `pending`.",
        description:
          "422 `label_too_long` when a branch other than production would have a host label `<app>-<branch>` longer than 63 characters. " +
          "409 `host_label_taken` (with `host_label`) when a new branch's host label is one another app answers to: app `shop-dev`, or the branch `dev` of another app `shop`.",
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            app_name: { type: "string", minLength: 1, maxLength: 128, description: "Sanitised to a lowercase slug; a numeric suffix is added when another group holds it or another app's branch is served at it (`shop` branch `dev` answers at `shop-dev`), and to `id`, `history` and `queue`, words routes of this API read as their own (`id` registers as `id-2`)." },
            repository: { type: "string", description: "https://, http://, ssh:// or git@host:path (file:// where allowed); at most 2048 characters." },
            display_name: { type: "string", description: "At most 200 characters once trimmed; defaults to the display name of the app's other branches, else app_name as sent." },
            branch: { type: "string", minLength: 1, default: "main" },
            description: { type: "string", description: "At most 2000 characters once trimmed." },
            config_path: { type: "string", minLength: 1, default: "platform.yaml" },
            group_slug: {
              type: "string",
              description:
                "Group to register in (alias `group`); defaults to the group you act in. Needs the deploy scope there too (403). " +
                "422 `group_selectors_differ` when it and `group`, or it and the group selected with ?group= or X-Platform-Group, name different groups.",
            },
            group: { type: "string", description: "Alias of group_slug." },
            git_clone_provider: {
              type: "string",
              description:
                "Clone with your linked account on this provider (`github` or `gitlab`). Accounts are linked by the sign-in flows, which this " +
                "platform does not offer yet: 422 `no_user_session` for an API key, `not_linked` for a session; other names are 422 too.",
            },
            deploy_config: { type: "object", additionalProperties: true, description: "Stored as sent, as by an app update." },
            services: { type: "array", description: "Stored as sent, as by an app update." },
            containers: { type: "array", description: "Stored as sent, as by an app update." },
            database_enabled: { type: "boolean", description: "Default false, or `deploy_config.database.enabled` when that is sent." },
            cache_enabled: { type: "boolean", description: "Default false, or `deploy_config.cache.enabled` when that is sent." },
            email_enabled: { type: "boolean", description: "Default false, or `deploy_config.email.enabled` when that is sent." },
            copy_vars_from_branch: {
              type: "string",
              minLength: 1,
              description: "Copy variables from another branch of this app (existing keys never overwritten); 409 when the new branch is or would become production, 404 unknown source, 422 no other branch.",
            },
            clone_data_from_branch: { type: "string", minLength: 1, description:
                "Restore data from another branch on the first deploy; same 404 and 409 refusals; 422 with seed_from_reference; 503 until every agent can run the copy. " +
                "No agent of this version can, so once every other rule has passed the registration is refused 503 `clone_data_unavailable` " +
                "(detail carries `source_branch` and the `components` that would be copied) and nothing is written.",
            },
            clone_components: {
              type: "object",
              description: "Defaults db true, drives false, buckets false; db plus drives when omitted entirely. All three false is 422 `nothing_to_clone`.",
              properties: { db: { type: "boolean", default: true }, drives: { type: "boolean", default: false }, buckets: { type: "boolean", default: false } },
            },
            seed_from_reference: { type: "string", minLength: 1, maxLength: 512, description: "`<app>:<branch>:<selector>` in this app or the same group, consumed on the first deploy; the branch registered itself is 422 `seed_is_this_branch`." },
          },
          required: ["app_name", "repository"],
        },
        response: {
          201: appResponse,
          ...authErrors,
          ...bodyErrors,
          ...groupLockErrors("`app_exists`, `branch_collides` or `repository_already_registered`"),
          503: { $ref: "Error#", description: "`clone_data_unavailable`: clone_data_from_branch asks for a data copy no agent can run yet; nothing written." },
        },
      },
    },
    async (request, reply) => {
      const b = request.body as Record<string, unknown>;
      if (typeof b.group_slug === "string" && typeof b.group === "string" && b.group_slug.trim() !== b.group.trim()) {
        throw PlatformError.invalid({ code: "group_selectors_differ", message: `group_slug '${b.group_slug}' and its alias group '${b.group}' differ; send one.` });
      }
      const groupSlug = ((b.group_slug ?? b.group) as string) ?? "";
      requireScopeInNamedGroup(request, groupSlug, "deploy");
      const r = await apps.registerApp({
        caller: callerOf(request),
        appName: String(b.app_name),
        repository: String(b.repository),
        displayName: (b.display_name as string) ?? "",
        branch: (b.branch as string) ?? "main",
        description: (b.description as string) ?? "",
        configPath: (b.config_path as string) ?? "",
        groupSlug,
        settings: fromJson(ValueSchema, Object.fromEntries(REGISTRATION_SETTINGS.filter((f) => b[f] !== undefined).map((f) => [f, b[f] as JsonValue]))),
        gitCloneProvider: (b.git_clone_provider as string) ?? "",
        copyVarsFromBranch: (b.copy_vars_from_branch as string) ?? "",
        cloneDataFromBranch: (b.clone_data_from_branch as string) ?? "",
        cloneComponents: b.clone_components as { db: boolean; drives: boolean; buckets: boolean } | undefined,
        seedFromReference: (b.seed_from_reference as string) ?? "",
      });
      return reply.code(201).send({
        ...appJson(r.app!, true),
        preflight_action_id: r.preflightActionId,
        ...(b.copy_vars_from_branch !== undefined ? { copied_var_keys: r.copiedVarKeys } : {}),
        ...(r.cloneDataScheduled
          ? { clone_data_scheduled: { source_branch: r.cloneDataScheduled.sourceBranch, components: r.cloneDataScheduled.components } }
          : {}),
      });
    },
  );

  app.get(
    "/api/apps",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["apps"],
        summary: "Apps of the group you act in (operators without ?group=: every group's).",
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: {
              items: { type: "array", items: appResponse },
              total: { type: "integer" },
              domain: { type: "string", description: "The environment base domain (`{environment}.{platform domain}`): app front doors are its subdomains." },
            },
            required: ["items", "total", "domain"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const r = await apps.listApps({ caller: callerOf(request) });
      return { items: r.items.map((a) => appJson(a, false)), total: r.total, domain: `${env.environment}.${env.domain}` };
    },
  );

  app.get(
    "/api/apps/:app_name",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["apps"],
        summary: "One app on one branch (default: the production branch).",
        params: appName,
        querystring: branchQuery,
        response: { 200: appResponse, ...authErrors },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      return appJson(await apps.getApp({ caller: callerOf(request), appName: app_name, branch: branch ?? "" }), true);
    },
  );

  app.delete(
    "/api/apps/:app_name",
    {
      config: { access: { scope: "admin" } },
      schema: {
        tags: ["apps"],
        summary: "Delete one branch's registration (the only branch when ?branch= is omitted).",
        params: appName,
        querystring: {
          type: "object",
          properties: { ...commonQuery, branch: { type: "string", description: "The branch to delete; required when the app has several (409 `branch_required`)." } },
        },
        response: {
          204: { type: "null", description: "Deleted." },
          409: {
            $ref: "Error#",
            description:
              "`branch_required` (several branches: name one); `app_running` (it serves or may: undeploy it first); `build_in_flight` (a build of the branch has not ended: cancel it or wait; `build_id`); " +
              "`action_in_flight` (a deploy, undeploy, service action or other queue action of the branch is queued or running, a preflight and a build excepted: cancel it or wait; `action_id`, `action_type`; " +
              "without ?branch=, any branch's); `production_branch` (promote another first).",
          },
          ...authErrors,
        },
      },
    },
    async (request, reply) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const caller = callerOf(request);
      const live = await queue.listQueue({ caller, appName: app_name, all: false, excludeTypes: NOT_HOLDING_DELETION, limit: 100 });
      refuseDeletionDuringAction(live.items, branch);
      await apps.deleteApp({ caller, appName: app_name, branch: branch ?? "" });
      return reply.code(204).send();
    },
  );

  app.get(
    "/api/apps/:app_name/branches",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["apps"],
        summary: "The app's registered branches.",
        description:
          "With `next_branch`, also what registering that branch would meet: next_branch_would_be_production (null when it cannot be registered), " +
          "production_branch, next_branch_copy_refusal (`{code, message}` of the first refusal registering the branch with copy_vars_from_branch or clone_data_from_branch would get, " +
          "its own rules included: `app_exists`, `invalid_branch`, `label_too_long`...; or null) " +
          "and clone_components_available. Without it those keys are absent. The preview enforces nothing.",
        params: appName,
        querystring: { type: "object", properties: { ...commonQuery, next_branch: { type: "string", maxLength: 255 } } },
        response: {
          200: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              environment: { type: "string" },
              branches: {
                type: "array",
                items: {
                  type: "object",
                  properties: {
                    branch: { type: "string" },
                    is_production: { type: "boolean" },
                    deploy_status: { type: "string" },
                    preflight_status: { type: "string" },
                    latest_build: { type: ["string", "null"] },
                    created_at: { type: "string" },
                  },
                },
              },
              next_branch_would_be_production: { type: ["boolean", "null"] },
              production_branch: { type: ["string", "null"] },
              next_branch_copy_refusal: {
                type: ["object", "null"],
                properties: { code: { type: "string" }, message: { type: "string" } },
              },
              clone_components_available: {
                type: "object",
                properties: { db: { type: "boolean" }, drives: { type: "boolean" }, buckets: { type: "boolean" } },
              },
            },
            required: ["app_name", "environment", "branches"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { next_branch } = request.query as { next_branch?: string };
      const r = await apps.listBranches({ caller: callerOf(request), appName: app_name, nextBranch: next_branch });
      const next = r.next && {
        next_branch_would_be_production: r.next.wouldBeProduction ?? null,
        production_branch: r.next.productionBranch ?? null,
        next_branch_copy_refusal: r.next.copyRefusalCode ? { code: r.next.copyRefusalCode, message: r.next.copyRefusalMessage ?? "" } : null,
        clone_components_available: { db: r.next.cloneDb, drives: r.next.cloneDrives, buckets: r.next.cloneBuckets },
      };
      return {
        ...next,
        app_name: r.appName,
        environment: env.environment,
        branches: r.branches.map((b) => ({
          branch: b.branch,
          is_production: b.isProduction,
          deploy_status: b.deployStatus,
          preflight_status: b.preflightStatus,
          latest_build: orNull(b.latestBuild),
          created_at: b.createdAt,
        })),
      };
    },
  );

  app.post(
    "/api/apps/:app_name/preflight/recheck",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["apps"],
        summary: "Re-run the repository preflight; the app is `pending` until an agent answers.",
        description:
          "GIT_PREFLIGHT is a fast agent RPC, never in the deploy lane: `preflight_action_id` identifies this request (an answer to an older " +
          "one is ignored) but is not a row of GET /api/deployments/queue. Follow `preflight_status` and `preflight_result` on the app. " +
          "Platform operators may send `{\"exempt\": true}` to exempt the app from preflight (`preflight_status: exempt` unlocks build, deploy and retry " +
          "whatever the repository check answers; the check still runs, and its answer is recorded on the GIT_PREFLIGHT action only), or " +
          "`{\"exempt\": false}` to lift the exemption (the app is `pending` until the check answers). `exempt` from anyone else is 403.",
        params: appName,
        querystring: branchQuery,
        body: {
          type: ["object", "null"],
          properties: { exempt: { type: "boolean", description: "Platform operators only: exempt the app from preflight (true) or lift the exemption (false)." } },
        },
        response: {
          202: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              branch: { type: "string" },
              preflight_status: { type: "string" },
              preflight_action_id: { type: "string" },
            },
          },
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request, reply) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const body = (request.body ?? {}) as { exempt?: boolean };
      const r = await apps.recheckPreflight({ caller: callerOf(request), appName: app_name, branch: branch ?? "", exempt: body.exempt });
      return reply.code(202).send({ app_name: r.appName, branch: r.branch, preflight_status: r.preflightStatus, preflight_action_id: r.preflightActionId });
    },
  );
}
