/** Connect handlers for builds (doc 1 section 4.3). */
import { create } from "@bufbuild/protobuf";
import { allowFileRepos } from "@platform/config";
import { BuildSchema, type Build as BuildMsg } from "@platform/proto";
import { requireCaller, spansEveryGroup } from "@platform/caller";
import type { Build } from "./entities/index.ts";
import { sqlPool } from "@platform/db";
import { buildDuration, buildNotFound, callerForBuild, findBuildByPrefix, findBuildByTag, listBuilds, triggerBuild, triggerBuildOfRegisteredApp } from "./domain/builds.ts";
import type { AppsBuildsContext, Handlers } from "./rpc.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : undefined);

export function buildMsg(b: Build, withLog = false): BuildMsg {
  return create(BuildSchema, {
    id: b.id,
    appName: b.appName,
    displayName: b.displayName,
    tag: b.tag,
    commitHash: b.commitHash ?? undefined,
    commitMessage: b.commitMessage ?? undefined,
    commitAuthor: b.commitAuthor ?? undefined,
    commitCommittedAt: iso(b.commitCommittedAt),
    branch: b.branch,
    status: b.status,
    codebuildId: b.id,
    codebuildPhase: b.codebuildPhase,
    durationSeconds: buildDuration(b, new Date()),
    images: b.images,
    errorMessage: b.errorMessage ?? undefined,
    createdBy: b.createdBy,
    startedAt: iso(b.startedAt),
    completedAt: iso(b.completedAt),
    createdAt: iso(b.createdAt),
    updatedAt: iso(b.updatedAt),
    groupSlug: b.groupSlug,
    queueStatus: b.queueStatus,
    log: withLog ? (b.log ?? undefined) : undefined,
    deployActionId: b.deployActionId ?? undefined,
  });
}

export function buildHandlers(ctx: AppsBuildsContext): Handlers {
  const policy = { allowFileRepos: allowFileRepos(ctx.config) };
  const db = sqlPool(ctx.orm);
  return {
    async triggerBuild(req) {
      const given = requireCaller(req.caller);
      // Only an operator who named no group needs the look-up; a tenant's build skips it (the hot path).
      const caller = spansEveryGroup(given) ? await ctx.read((em) => callerForBuild(em, given, req.appName)) : given;
      const input = {
        appName: req.appName,
        repository: req.repository,
        branch: req.branch || "main",
        autoDeploy: req.autoDeploy,
        configPath: req.configPath,
        skipPreflight: req.skipPreflight,
      };
      let triggered = await triggerBuildOfRegisteredApp(await db, caller, input);
      // Its statement committed outside ctx.write, which wakes the relay after the ORM path.
      if (triggered) ctx.relay.kick();
      else triggered = await triggerBuild({ lock: ctx.groupLock, transact: ctx.write }, caller, input, policy);
      return { tag: triggered.tag, actionId: triggered.buildId, buildId: triggered.buildId, status: "queued", registered: triggered.registered, appName: triggered.appName };
    },

    async listBuilds(req) {
      const caller = requireCaller(req.caller);
      const r = await ctx.read((em) =>
        listBuilds(em, caller, { appName: req.appName, branch: req.branch, since: req.since, limit: req.limit || 50, offset: req.offset }),
      );
      return { items: r.items.map((b) => buildMsg(b)), total: r.total };
    },

    async getBuild(req) {
      const caller = requireCaller(req.caller);
      const build = await ctx.read((em) => findBuildByPrefix(em, caller, req.buildId));
      if (!build) throw buildNotFound(req.buildId);
      return buildMsg(build, true);
    },

    async getBuildByTag(req) {
      const caller = requireCaller(req.caller);
      return buildMsg(await ctx.read((em) => findBuildByTag(em, caller, req.appName, req.tag)));
    },
  };
}
