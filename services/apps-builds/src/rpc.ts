/** Connect handlers of apps-builds: thin translations between protobuf and the domain. */
import type { ConnectRouter, ServiceImpl } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ListValueSchema, ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { fromJson, toJson } from "@bufbuild/protobuf";
import { allowFileRepos } from "@platform/config";
import { AppSchema, AppsBuildsService, BranchSchema, type App as AppMsg } from "@platform/proto";
import { actorOf, requireCaller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { crashLoopWarnings } from "./domain/crash-loops.ts";
import type { ServiceContext } from "@platform/service";
import { Build, type App } from "./entities/index.ts";
import { appUrls, serviceUrls, type RouterSettings } from "./domain/front-door.ts";
import { resolveClaimedRelease, resolveRelease } from "./domain/releases.ts";
import { buildCounts } from "./domain/builds.ts";
import { servingVersion } from "./domain/deploy-state.ts";
import { setPrimaryServices, setServiceReplicas } from "./domain/scale.ts";
import { appBranches, deleteApp, findApp, listApps } from "./domain/apps.ts";
import { nextBranchPreview } from "./domain/next-branch.ts";
import { hostLabelsTaken, registerUnderGroupLock } from "./domain/registration.ts";
import { validBranchLabel } from "./domain/naming.ts";
import type { GroupLock } from "./domain/group-lock.ts";
import { requeuePreflight, setPreflightExemption } from "./domain/preflight.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : undefined);

/** Where front doors are: read from the service's config once. */
export function routerSettings(config: { PLATFORM_ENVIRONMENT: string; PLATFORM_DOMAIN: string; PLATFORM_ROUTER_PORT: number }): RouterSettings {
  return { environment: config.PLATFORM_ENVIRONMENT, domain: config.PLATFORM_DOMAIN, port: config.PLATFORM_ROUTER_PORT };
}

/** The single-app fields beyond the list shape (spec 2.1). */
export interface SingleAppExtras {
  lastBuild: Build | null;
}

/** The single-app response (GET, PATCH, primary-services): the list shape and the latest build's outcome. */
export async function singleAppMsg(em: EntityManager, app: App, router: RouterSettings): Promise<AppMsg> {
  // After a write, the answer is the row as stored: updated_at is set when the change is flushed.
  await em.flush();
  const lastBuild = await em.findOne(Build, { appId: app.id }, { orderBy: { createdAt: "desc" } });
  return appMsg(app, router, (await buildCounts(em, [app])).get(app.id) ?? 0, { lastBuild });
}

/** `builds`: the app's build_count (see buildCounts). */
export function appMsg(a: App, router: RouterSettings, builds: number, single?: SingleAppExtras): AppMsg {
  const undeployed = a.deployStatus === "undeployed";
  const services = serviceUrls(a, router);
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
    buildCount: builds,
    // Null whenever nothing serves (spec 2.1 rule 4).
    runningVersion: servingVersion(a) ?? undefined,
    runningBuildId: undeployed ? undefined : (a.runningBuildId ?? undefined),
    runningSince: undeployed ? undefined : iso(a.runningSince),
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
    deployWarning: undeployed ? undefined : (a.deployWarning ?? undefined),
    warnings: [...a.warnings, ...crashLoopWarnings(a)],
    createdAt: iso(a.createdAt),
    updatedAt: iso(a.updatedAt),
    createdBy: a.createdBy,
    serviceNames: a.serviceNames,
    urls: appUrls(a, services),
    services: services.map((s) => ({ name: s.name, url: s.url ?? undefined, inServingRelease: s.inServingRelease })),
    ...(single
      ? {
          lastDeployStatus: a.lastDeployStatus ?? undefined,
          lastDeployError: a.lastDeployError ?? undefined,
          lastCrashOutputJson: a.lastCrashOutput && !undeployed ? JSON.stringify(a.lastCrashOutput) : "",
          lastBuildStatus: single.lastBuild?.status,
          lastBuildError: single.lastBuild?.errorMessage ?? undefined,
        }
      : {}),
  });
}

export type AppsBuildsContext = ServiceContext & {
  config: { PLATFORM_ALLOW_FILE_REPOS?: boolean; PLATFORM_ENVIRONMENT: string; PLATFORM_DOMAIN: string; PLATFORM_ROUTER_PORT: number };
  /** identity's group lock, which registrations take. */
  groupLock: GroupLock;
};

/** Handlers of AppsBuildsService; each capability contributes its own group of methods. */
export type Handlers = Partial<ServiceImpl<typeof AppsBuildsService>>;

/** A JSON body carried as a `google.protobuf.Value`; undefined when none was sent. */
export const bodyOf = (value: Value | undefined): unknown => (value ? toJson(ValueSchema, value) : undefined);

export function routes(ctx: AppsBuildsContext, ...more: Array<(ctx: AppsBuildsContext) => Handlers>) {
  return (router: ConnectRouter) => {
    router.service(AppsBuildsService, Object.assign({}, appHandlers(ctx), ...more.map((h) => h(ctx))));
  };
}

function appHandlers(ctx: AppsBuildsContext): Handlers {
  const policy = { allowFileRepos: allowFileRepos(ctx.config) };
  const router = routerSettings(ctx.config);
  return {
      readiness: (req) => ctx.readiness(req),

      async registerApp(req) {
        const caller = requireCaller(req.caller);
        const { app, preflightActionId, copiedVarKeys, cloneDataScheduled } = await registerUnderGroupLock(
          { lock: ctx.groupLock, transact: ctx.write },
          caller,
          {
            appName: req.appName,
            repository: req.repository,
            displayName: req.displayName,
            branch: req.branch,
            description: req.description,
            configPath: req.configPath,
            groupSlug: req.groupSlug,
            settings: bodyOf(req.settings),
            gitCloneProvider: req.gitCloneProvider,
            copyVarsFromBranch: req.copyVarsFromBranch,
            cloneDataFromBranch: req.cloneDataFromBranch,
            cloneComponents: req.cloneComponents
              ? { db: req.cloneComponents.db, drives: req.cloneComponents.drives, buckets: req.cloneComponents.buckets }
              : undefined,
            seedFromReference: req.seedFromReference,
          },
          policy,
        );
        // A new registration has no builds; one made by a build request's auto-registration neither.
        return { app: appMsg(app, router, app.buildCount), preflightActionId, copiedVarKeys: copiedVarKeys ?? [], cloneDataScheduled: cloneDataScheduled
            ? { sourceBranch: cloneDataScheduled.source_branch, components: cloneDataScheduled.components }
            : undefined,
        };
      },

      async listApps(req) {
        const caller = requireCaller(req.caller);
        const { apps, counts } = await ctx.read(async (em) => {
          const apps = await listApps(em, caller);
          return { apps, counts: await buildCounts(em, apps) };
        });
        return { items: apps.map((a) => appMsg(a, router, counts.get(a.id) ?? 0)), total: apps.length };
      },

      async getApp(req) {
        const caller = requireCaller(req.caller);
        return ctx.read(async (em) => {
          return singleAppMsg(em, await findApp(em, caller, req.appName, req.branch || undefined), router);
        });
      },

      async setServiceReplicas(req) {
        const caller = requireCaller(req.caller);
        const r = await ctx.write((em) => setServiceReplicas(em, caller, req.appName, req.branch, req.service, req.replicas));
        return {
          appName: r.app.appName,
          branch: r.app.branch,
          groupSlug: r.app.groupSlug,
          service: r.service,
          previous: r.previous,
          requested: r.requested,
          noop: r.noop,
          overlayPaths: r.overlayPaths,
          imageTag: r.app.runningVersion ?? undefined,
        };
      },

      async setPrimaryServices(req) {
        const caller = requireCaller(req.caller);
        return ctx.write(async (em) => {
          return singleAppMsg(em, await setPrimaryServices(em, caller, req.appName, req.branch, req.primary), router);
        });
      },

      async resolveRelease(req) {
        const caller = req.caller ? requireCaller(req.caller) : null;
        const query = {
          appName: req.appName,
          branch: req.branch,
          imageTag: req.imageTag,
          groupSlug: req.groupSlug,
          skipPreflight: req.skipPreflight,
          allowPendingBuild: req.allowPendingBuild,
        };
        const r = caller || query.allowPendingBuild ? await ctx.read((em) => resolveRelease(em, caller, query, router)) : await resolveClaimedRelease(ctx.read, query, router);
        return {
          appId: r.app.id,
          appName: r.app.appName,
          branch: r.app.branch,
          groupSlug: r.app.groupSlug,
          imageTag: r.imageTag,
          buildId: r.buildId ?? "",
          configJson: JSON.stringify(r.config),
          env: r.env,
          hosts: r.hosts,
          visibility: r.app.visibility,
          isProduction: r.app.isProduction,
          deployStatus: r.app.deployStatus,
          runningVersion: r.app.runningVersion ?? undefined,
          configPath: r.app.configPath,
          primary: r.app.primaryOverrides ?? {},
        };
      },

      async deleteApp(req) {
        const caller = requireCaller(req.caller);
        await ctx.write((em) => deleteApp(em, caller, req.appName, req.branch || undefined));
        return {};
      },

      async listBranches(req) {
        const caller = requireCaller(req.caller);
        const { rows, takenHostLabels } = await ctx.read(async (em) => {
          const rows = await appBranches(em, caller, req.appName);
          const label = req.nextBranch === undefined || rows.length === 0 ? undefined : validBranchLabel(req.nextBranch);
          return { rows, takenHostLabels: label === undefined ? new Set<string>() : await hostLabelsTaken(em, `${rows[0]!.appName}-${label}`, []) };
        });
        const next = req.nextBranch === undefined ? undefined : nextBranchPreview(rows, req.nextBranch, takenHostLabels);
        return {
          appName: req.appName,
          next: next && {
            wouldBeProduction: next.wouldBeProduction ?? undefined,
            productionBranch: next.productionBranch ?? undefined,
            copyRefusalCode: next.copyRefusal?.code,
            copyRefusalMessage: next.copyRefusal?.message,
            cloneDb: next.cloneComponentsAvailable.db,
            cloneDrives: next.cloneComponentsAvailable.drives,
            cloneBuckets: next.cloneComponentsAvailable.buckets,
          },
          branches: rows.map((a) =>
            create(BranchSchema, {
              branch: a.branch,
              groupSlug: a.groupSlug,
              isProduction: a.isProduction,
              deployStatus: a.deployStatus,
              preflightStatus: a.preflightStatus,
              latestBuild: a.latestBuild ?? undefined,
              createdAt: iso(a.createdAt),
              runningVersion: servingVersion(a) ?? undefined,
            }),
          ),
        };
      },

      async recheckPreflight(req) {
        const caller = requireCaller(req.caller);
        return ctx.write(async (em) => {
          const app = await findApp(em, caller, req.appName, req.branch || undefined);
          if (req.exempt !== undefined) setPreflightExemption(app, caller, req.exempt);
          const preflightActionId = requeuePreflight(em, app, actorOf(caller));
          return { appName: app.appName, branch: app.branch, preflightStatus: app.preflightStatus, preflightActionId };
        });
      },
  };
}
