import { defineEntity, p } from "@mikro-orm/core";
import type { CrashLoop } from "../domain/crash-loops.ts";

export interface PreflightResultData {
  reason: string;
  detail: string;
  services: string[];
  missing_paths: string[];
  errors: Array<Record<string, unknown>>;
}

/** One registered app on one branch: an app is unique by (app_name, branch) in the environment. */
export const AppSchema = defineEntity({
  name: "App",
  tableName: "apps",
  properties: {
    id: p.uuid().primary(),
    appName: p.text(),
    /** The sanitised name asked for; app_name may carry a numeric suffix when another group has it. */
    baseName: p.text(),
    displayName: p.text(),
    slug: p.text(),
    groupSlug: p.text(),
    branch: p.text(),
    /** The branch as it appears in hostnames; two branches of an app may not share one. */
    branchLabel: p.text(),
    repository: p.text(),
    /** The repository URL normalised for the same-repository rule. */
    repositoryKey: p.text(),
    configPath: p.text(),
    description: p.text(),
    deployStatus: p.text(),
    visibility: p.text(),
    isProduction: p.boolean(),
    latestBuild: p.text().nullable(),
    /** Builds counted whose rows a purge deleted; build_count adds the rows there are (buildCounts). */
    buildCount: p.integer(),
    runningVersion: p.text().nullable(),
    runningBuildId: p.uuid().nullable(),
    runningSince: p.datetime().nullable(),
    /** The serving release's routing shape as its agent reported it: service -> mount (null: unrouted). */
    runningMounts: p.json<Record<string, string | null>>().nullable(),
    /** When the branch's first deploy completed (a seed reference is consumed by it). */
    firstDeployedAt: p.datetime().nullable(),
    databaseEnabled: p.boolean(),
    cacheEnabled: p.boolean(),
    emailEnabled: p.boolean(),
    preflightStatus: p.text(),
    preflightResult: p.json<PreflightResultData>().nullable(),
    /** Bumped by every re-queue; a preflight answer for an older nonce is ignored. */
    preflightNonce: p.integer(),
    serviceNames: p.json<string[]>(),
    warnings: p.json<string[]>(),
    /** replica id -> its crash loop, as agents told it (domain/crash-loops.ts). */
    crashLoops: p.json<Record<string, CrashLoop>>().defaultRaw("'{}'"),
    deployWarning: p.text().nullable(),
    /** The DEPLOY, RETRY or UNDEPLOY action the last_* fields describe. */
    lastDeployActionId: p.uuid().nullable(),
    lastDeployStatus: p.text().nullable(),
    lastDeployError: p.text().nullable(),
    /** When deploy-queue wrote the action update the last_* and running_* fields follow. */
    lastDeployUpdateAt: p.datetime().nullable(),
    /** service name -> at most 30 lines, captured when the latest deploy failed its health checks. */
    lastCrashOutput: p.json<Record<string, string[]>>().nullable(),
    /** PATCH primary-services: per-service overrides, effective immediately. */
    primaryOverrides: p.json<Record<string, boolean>>(),
    /** The repository's config as the last successful build (or preflight) read it. */
    baseConfig: p.json<Record<string, unknown>>().nullable(),
    /** Dashboard edits over the base: `{path: {value, base}}` (spec 4.4 config layers). */
    overlay: p.json<Record<string, { value: unknown; base: unknown }>>(),
    seedFromReference: p.text().nullable(),
    cloneData: p.json<{ source_branch: string; components: { db: boolean; drives: boolean; buckets: boolean } }>().nullable(),
    /** Deploy settings as the client sent them (register or PATCH): an object, and two lists. */
    deployConfig: p.json<Record<string, unknown>>().nullable(),
    deployServices: p.json<unknown[]>().nullable(),
    deployContainers: p.json<unknown[]>().nullable(),
    createdBy: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
    updatedAt: p.datetime().defaultRaw("now()").onUpdate(() => new Date()),
  },
});
export class App extends AppSchema.class {}
AppSchema.setClass(App);


/**
 * A build (spec doc 1 section 2.2): its id is the BUILD action's id. The row keeps `queued` while
 * the agent works and is finalised at completion; `queueStatus` follows the live lifecycle.
 */
export const BuildSchema = defineEntity({
  name: "Build",
  tableName: "builds",
  properties: {
    id: p.uuid().primary(),
    appId: p.uuid(),
    appName: p.text(),
    displayName: p.text(),
    groupSlug: p.text(),
    branch: p.text(),
    tag: p.text(),
    commitHash: p.text().nullable(),
    commitMessage: p.text().nullable(),
    commitAuthor: p.text().nullable(),
    commitCommittedAt: p.datetime().nullable(),
    status: p.text(),
    queueStatus: p.text(),
    codebuildPhase: p.text(),
    durationSeconds: p.integer().nullable(),
    images: p.json<string[]>(),
    errorMessage: p.text().nullable(),
    log: p.text().nullable(),
    /** The repository config of the commit built (platform.yaml as authored). */
    config: p.json<Record<string, unknown>>().nullable(),
    autoDeploy: p.boolean(),
    deployActionId: p.uuid().nullable(),
    createdBy: p.text(),
    startedAt: p.datetime().nullable(),
    completedAt: p.datetime().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
    updatedAt: p.datetime().defaultRaw("now()").onUpdate(() => new Date()),
  },
});
export class Build extends BuildSchema.class {}
BuildSchema.setClass(Build);

export const entities = [AppSchema, BuildSchema];
