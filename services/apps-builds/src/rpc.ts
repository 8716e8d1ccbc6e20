/** Connect handlers of apps-builds: thin translations between protobuf and the domain. */
import type { ConnectRouter, ServiceImpl } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ListValueSchema } from "@bufbuild/protobuf/wkt";
import { fromJson } from "@bufbuild/protobuf";
import { allowFileRepos } from "@platform/config";
import { AppSchema, AppsBuildsService, BranchSchema, type App as AppMsg } from "@platform/proto";
import { requireCaller } from "@platform/caller";
import type { ServiceContext } from "@platform/service";
import type { App } from "./entities/index.ts";
import { appBranches, deleteApp, findApp, listApps } from "./domain/apps.ts";
import { registerApp } from "./domain/registration.ts";
import { requeuePreflight } from "./domain/preflight.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : undefined);

export function appMsg(a: App): AppMsg {
  return create(AppSchema, {
    id: a.id,
    appName: a.appName,
    displayName: a.displayName,
    slug: a.slug,
    groupSlug: a.groupSlug,
    branch: a.branch,
    repository: a.repository,
    configPath: a.configPath,
    description: a.description,
    deployStatus: a.deployStatus,
    visibility: a.visibility,
    isProduction: a.isProduction,
    latestBuild: a.latestBuild ?? undefined,
    buildCount: a.buildCount,
    // Null whenever nothing serves (spec 2.1 rule 4).
    runningVersion: a.deployStatus === "undeployed" ? undefined : (a.runningVersion ?? undefined),
    runningBuildId: a.deployStatus === "undeployed" ? undefined : (a.runningBuildId ?? undefined),
    runningSince: a.deployStatus === "undeployed" ? undefined : iso(a.runningSince),
    databaseEnabled: a.databaseEnabled,
    cacheEnabled: a.cacheEnabled,
    emailEnabled: a.emailEnabled,
    preflightStatus: a.preflightStatus,
    preflightResult: a.preflightResult
      ? {
          reason: a.preflightResult.reason,
          detail: a.preflightResult.detail,
          services: a.preflightResult.services,
          missingPaths: a.preflightResult.missing_paths,
          errors: fromJson(ListValueSchema, a.preflightResult.errors as never),
        }
      : undefined,
    deployWarning: a.deployStatus === "undeployed" ? undefined : (a.deployWarning ?? undefined),
    warnings: a.warnings,
    createdAt: iso(a.createdAt),
    updatedAt: iso(a.updatedAt),
    createdBy: a.createdBy,
    serviceNames: a.serviceNames,
  });
}

export type AppsBuildsContext = ServiceContext & { config: { PLATFORM_ALLOW_FILE_REPOS?: boolean } };

/** Handlers of AppsBuildsService; each capability contributes its own group of methods. */
export type Handlers = Partial<ServiceImpl<typeof AppsBuildsService>>;

export function routes(ctx: AppsBuildsContext, ...more: Array<(ctx: AppsBuildsContext) => Handlers>) {
  return (router: ConnectRouter) => {
    router.service(AppsBuildsService, Object.assign({}, appHandlers(ctx), ...more.map((h) => h(ctx))));
  };
}

function appHandlers(ctx: AppsBuildsContext): Handlers {
  const policy = { allowFileRepos: allowFileRepos(ctx.config) };
  return {
      readiness: (req) => ctx.readiness(req),

      async registerApp(req) {
        const caller = requireCaller(req.caller);
        const { app, preflightActionId, copiedVarKeys, cloneDataScheduled } = await ctx.write((em) =>
          registerApp(
            em,
            caller,
            {
              appName: req.appName,
              repository: req.repository,
              displayName: req.displayName,
              branch: req.branch,
              description: req.description,
              configPath: req.configPath,
              groupSlug: req.groupSlug,
              databaseEnabled: req.databaseEnabled,
              cacheEnabled: req.cacheEnabled,
              emailEnabled: req.emailEnabled,
              copyVarsFromBranch: req.copyVarsFromBranch,
              cloneDataFromBranch: req.cloneDataFromBranch,
              cloneComponents: req.cloneComponents
                ? { db: req.cloneComponents.db, drives: req.cloneComponents.drives, buckets: req.cloneComponents.buckets }
                : undefined,
              seedFromReference: req.seedFromReference,
            },
            policy,
          ),
        );
        return { app: appMsg(app), preflightActionId, copiedVarKeys: copiedVarKeys ?? [], cloneDataScheduled: cloneDataScheduled
            ? { sourceBranch: cloneDataScheduled.source_branch, components: cloneDataScheduled.components }
            : undefined,
        };
      },

      async listApps(req) {
        const caller = requireCaller(req.caller);
        const apps = await ctx.read((em) => listApps(em, caller, req.allGroups));
        return { items: apps.map(appMsg), total: apps.length };
      },

      async getApp(req) {
        const caller = requireCaller(req.caller);
        return appMsg(await ctx.read((em) => findApp(em, caller, req.appName, req.branch || undefined)));
      },

      async deleteApp(req) {
        const caller = requireCaller(req.caller);
        await ctx.write((em) => deleteApp(em, caller, req.appName, req.branch || undefined));
        return {};
      },

      async listBranches(req) {
        const caller = requireCaller(req.caller);
        const rows = await ctx.read((em) => appBranches(em, caller, req.appName));
        return {
          appName: req.appName,
          branches: rows.map((a) =>
            create(BranchSchema, {
              branch: a.branch,
              isProduction: a.isProduction,
              deployStatus: a.deployStatus,
              preflightStatus: a.preflightStatus,
              latestBuild: a.latestBuild ?? undefined,
              createdAt: iso(a.createdAt),
            }),
          ),
        };
      },

      async recheckPreflight(req) {
        const caller = requireCaller(req.caller);
        return ctx.write(async (em) => {
          const app = await findApp(em, caller, req.appName, req.branch || undefined);
          const preflightActionId = requeuePreflight(em, app);
          return { appName: app.appName, branch: app.branch, preflightStatus: app.preflightStatus, preflightActionId };
        });
      },
  };
}
