/** Connect handlers of deploy-queue: thin translations between protobuf and the domain. */
import { UniqueConstraintViolationException } from "@mikro-orm/core";
import { ConnectError, type Client, type ConnectRouter } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ActionSchema, DeploymentSchema, DeployQueueService, type Action as ActionMsg, type App as AppMsg, type AppsBuildsService } from "@platform/proto";
import { inGroup, requireCaller, spansEveryGroup, type Caller } from "@platform/caller";
import { fromConnectError, PlatformError } from "@platform/errors";
import { isUuid } from "@platform/bus";
import type { ServiceContext } from "@platform/service";
import { Agent, type Action } from "./entities/index.ts";
import { servicesStatus } from "./domain/services-status.ts";
import { admitForce } from "./domain/admit-force.ts";
import { cancelAction, cancelBeforeIntake, cancelBuildsOfPurgedBranch, type UntakenBuild } from "./domain/cancel.ts";
import { claimAction, completeAction, reportProgress } from "./domain/claims.ts";
import { diagnoseAction } from "./domain/diagnose.ts";
import { queueStatus } from "./domain/lifecycle.ts";
import { branchBuildTags, checkStaticSiteFields, deploymentPhases, deploymentStatus, getDeployment, listDeployments, listHistory, lockedRetryTarget, pendingUndeploy, queueAppAction, queueDeployment, requestedServices, retryTarget } from "./domain/deployments.ts";
import { scaleBranch, serviceShapes, serviceTargets, undeployBranch } from "./domain/app-actions.ts";
import { deployedReplicas, lockScaleTarget, refuseScaleInFlight, scaleSavedNotDeployed } from "./domain/scale.ts";
import { checkPlacementPlan, type Dispatched } from "./domain/placement.ts";
import { publishDispatched } from "./workers.ts";
import { getVisibleAction } from "./domain/lookup.ts";
import { prioritize } from "./domain/prioritize.ts";
import { listQueue, withStuckClass, type ActionView } from "./domain/queue.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : undefined);
const opt = (s: string | null | undefined) => (s === null || s === undefined ? undefined : s);

/**
 * What the agent reported of where an action ran: the sources of a deployment's operator-only
 * fields (spec 2.4: instance_status, leader_instance, infrastructure), kept from tenants wherever
 * the result is shown.
 */
const OPERATOR_ONLY_RESULT_KEYS = ["instance_status", "host", "runtime"];
/**
 * The variables a release ran with: secrets, shown once, by the deployment history (spec 2.4),
 * never with the queue's view of the action.
 */
const HISTORY_ONLY_RESULT_KEYS = ["env_vars_snapshot"];

function resultFor(result: Record<string, unknown>, caller: Caller | undefined): Record<string, unknown> {
  if (!caller) return result;
  const hidden = caller.platformOperator ? HISTORY_ONLY_RESULT_KEYS : [...HISTORY_ONLY_RESULT_KEYS, ...OPERATOR_ONLY_RESULT_KEYS];
  return Object.fromEntries(Object.entries(result).filter(([key]) => !hidden.includes(key)));
}

/** An action as a message; with `caller`, as that caller may see it (without it, for agents). */
export function actionMsg({ action: a, stuckClass }: ActionView, caller?: Caller): ActionMsg {
  return create(ActionSchema, {
    actionId: a.id,
    appName: a.appName,
    branch: a.branch,
    actionType: a.actionType,
    status: a.status,
    imageTag: opt(a.imageTag),
    commitMessage: opt(a.commitMessage),
    commitAuthor: opt(a.commitAuthor),
    dependsOn: opt(a.dependsOn),
    autoDeploy: a.autoDeploy,
    admissionCheckReason: opt(a.admissionCheckReason),
    lastAdmissionCheckAt: iso(a.lastAdmissionCheckAt),
    stuckClass: stuckClass ?? undefined,
    deployWarnings: a.deployWarnings ?? [],
    serviceName: opt(a.serviceName),
    action: opt(a.action),
    createdAt: iso(a.createdAt) ?? "",
    updatedAt: iso(a.updatedAt) ?? "",
    groupSlug: a.groupSlug,
    phase: opt(a.phase),
    errorMessage: opt(a.errorMessage),
    claimedBy: opt(a.claimedBy),
    claimedAt: iso(a.claimedAt),
    completedAt: iso(a.completedAt),
    priority: a.priority,
    payloadJson: JSON.stringify(a.payload ?? {}),
    resultJson: a.result ? JSON.stringify(resultFor(a.result, caller)) : "",
    queueStatus: queueStatus(a),
    cancelRequested: a.cancelRequested,
  });
}

const json = (v: unknown) => (v === null || v === undefined ? "" : JSON.stringify(v));

export function deploymentMsg(a: Action, caller: Caller) {
  const operator = caller.platformOperator;
  return create(DeploymentSchema, {
    id: a.id,
    deploymentId: a.id,
    appName: a.appName,
    branch: a.branch,
    imageTag: opt(a.imageTag),
    status: deploymentStatus(a),
    phase: opt(a.phase),
    previousTag: opt((a.result?.previous_tag as string | undefined) ?? (a.payload?.previous_tag as string | undefined)),
    createdBy: a.createdBy,
    createdAt: iso(a.createdAt) ?? "",
    updatedAt: iso(a.updatedAt) ?? "",
    completedAt: iso(a.completedAt),
    // Operator-only fields: present in the schema, null for tenants (spec 2.4).
    placementPlanJson: operator ? json(a.payload?.placement_plan ?? { host: a.dispatchedTo ?? null }) : "",
    instanceStatusJson: operator ? json(a.result?.instance_status ?? null) : "",
    leaderInstance: operator ? opt(a.claimedBy) : undefined,
    infrastructureJson: operator ? json({ runtime: a.result?.runtime ?? null, host: a.claimedBy ?? a.dispatchedTo ?? null }) : "",
    actionType: a.actionType,
    errorMessage: opt(a.errorMessage),
    groupSlug: a.groupSlug,
  });
}

function parseJson(text: string, what: string): unknown {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    throw PlatformError.invalid(`${what} is not valid JSON.`);
  }
}

/**
 * The build of a full build id the queue does not know, while apps-builds still has it `queued`:
 * its request has not been taken in yet (see cancelBeforeIntake). Null for anything else.
 */
async function untakenBuild(apps: Client<typeof AppsBuildsService>, caller: Caller, id: string): Promise<UntakenBuild | null> {
  if (!isUuid(id)) return null;
  let build;
  try {
    build = await apps.getBuild({ caller, buildId: id });
  } catch (err) {
    // Unknown to apps-builds too, or apps-builds not answering: not found, as before intake could be asked.
    if (err instanceof ConnectError) return null;
    throw err;
  }
  if (build.id !== id || build.status !== "queued") return null;
  return {
    id: build.id,
    deployActionId: build.deployActionId ?? null,
    appName: build.appName,
    branch: build.branch,
    groupSlug: build.groupSlug,
    tag: build.tag,
    createdBy: build.createdBy,
    createdAt: new Date(build.createdAt),
  };
}

type DeclaredConfig = { type?: string; services?: Record<string, unknown> };

/**
 * The config an app branch declares: the release serving; else the latest build's; else (never
 * built) the config its preflight read, with the dashboard's overlay. Null when there is none.
 * What serves is authoritative, so failing to read it is an error; the fallbacks are best effort.
 */
async function declaredConfig(apps: Client<typeof AppsBuildsService>, caller: Caller, app: AppMsg): Promise<DeclaredConfig | null> {
  const running = app.deployStatus !== "undeployed" && Boolean(app.runningVersion);
  const tag = running ? app.runningVersion! : (app.latestBuild ?? "");
  if (tag) {
    const resolving = apps.resolveRelease({ caller: inGroup(caller, app.groupSlug), appName: app.appName, branch: app.branch, imageTag: tag, skipPreflight: true });
    const release = running ? await resolving : await resolving.catch(() => null);
    if (release) return JSON.parse(release.configJson) as DeclaredConfig;
  }
  const layers = await apps.getAppConfig({ caller: inGroup(caller, app.groupSlug), appName: app.appName, branch: app.branch }).catch(() => null);
  return (layers?.effective as DeclaredConfig | undefined) ?? null;
}

export function routes(ctx: ServiceContext, apps: Client<typeof AppsBuildsService>, opts: { fleetFloor: number; orphanedAfterMs: number }) {
  const view = async (action: Action | null, now: Date) =>
    action ? actionMsg((await ctx.read((em) => withStuckClass(em, [action], now)))[0]!) : undefined;

  return (router: ConnectRouter) => {
    router.service(DeployQueueService, {
      readiness: (req) => ctx.readiness(req),

      async listQueue(req) {
        const caller = requireCaller(req.caller);
        const rows = await ctx.read((em) =>
          listQueue(em, caller, { appName: req.appName, all: req.all, excludeTypes: req.excludeTypes, limit: req.limit }, new Date()),
        );
        return { items: rows.map((r) => actionMsg(r, caller)) };
      },

      async getAction(req) {
        const caller = requireCaller(req.caller);
        const now = new Date();
        return ctx.read(async (em) => actionMsg((await withStuckClass(em, [await getVisibleAction(em, caller, req.actionId)], now))[0]!, caller));
      },

      async diagnoseAction(req) {
        const caller = requireCaller(req.caller);
        const d = await ctx.read((em) => diagnoseAction(em, caller, req.actionId, new Date(), opts.orphanedAfterMs));
        return { action: actionMsg(d.view, caller), narrative: d.narrative, hint: d.hint, blockingActionId: d.blockingActionId ?? undefined };
      },

      async prioritize(req) {
        const caller = requireCaller(req.caller);
        const r = await ctx.write((em) => prioritize(em, caller, req.target));
        return { actionIds: r.actionIds };
      },

      async admitForce(req) {
        const caller = requireCaller(req.caller);
        const g = await ctx.write((em) => admitForce(em, caller, req.actionId, req.reason, req.ttlSeconds, new Date()));
        return { actionId: g.actionId, expiresAt: g.expiresAt.toISOString(), ttlSeconds: g.ttlSeconds };
      },

      async cancelAction(req) {
        const caller = requireCaller(req.caller);
        const cancel = () => ctx.write((em) => cancelAction(em, caller, req.actionId, req.reason, new Date()));
        let o = await cancel();
        const untaken = o.status === "not_found" ? await untakenBuild(apps, caller, req.actionId.trim()) : null;
        if (untaken) {
          try {
            o = await ctx.write((em) => cancelBeforeIntake(em, caller, untaken, req.reason, new Date()));
          } catch (err) {
            // Intake wrote the build's actions meanwhile: they are cancelled as any queued ones.
            if (!(err instanceof UniqueConstraintViolationException)) throw err;
            o = await cancel();
          }
        }
        return {
          actionId: o.actionId,
          status: o.status,
          cancelled: o.cancelled,
          cancelRequested: o.cancelRequested,
          queueStatus: o.queueStatus,
          dependentsCancelled: o.dependentsCancelled,
          appName: o.appName,
        };
      },

      async queueDeployment(req) {
        const caller = requireCaller(req.caller);
        // Refused before anything is read: a tenant does not choose hosts.
        const placementPlan = checkPlacementPlan(caller, parseJson(req.placementPlanJson, "placement_plan"));
        const release = await apps.resolveRelease({
          caller,
          appName: req.appName,
          branch: req.branch,
          imageTag: req.imageTag,
          skipPreflight: req.skipPreflight,
        });
        checkStaticSiteFields(req.staticSiteFields, release.configJson, release.appName);
        const services = requestedServices(parseJson(req.servicesJson, "services"), release.configJson);
        const dispatched: Dispatched[] = [];
        const action = await ctx.write((em) =>
          queueDeployment(
            em,
            caller,
            {
              appName: release.appName,
              branch: release.branch,
              groupSlug: release.groupSlug,
              imageTag: release.imageTag,
              buildId: release.buildId,
              configPath: release.configPath,
              runningVersion: release.runningVersion,
            },
            {
              services,
              placementPlan,
              reason: req.reason || "api",
            },
            new Date(),
            dispatched,
          ),
        );
        await publishDispatched(ctx, dispatched);
        return { deploymentId: action.id, actionId: action.id, status: "queued", imageTag: action.imageTag ?? "", appName: action.appName, branch: action.branch };
      },

      async listDeployments(req) {
        const caller = requireCaller(req.caller);
        const page = await ctx.read((em) => listDeployments(em, caller, { appName: req.appName, branch: req.branch, limit: req.limit, offset: req.offset }));
        return { items: page.items.map((a) => deploymentMsg(a, caller)), total: page.total };
      },

      async getDeployment(req) {
        const caller = requireCaller(req.caller);
        return deploymentMsg(await ctx.read((em) => getDeployment(em, caller, req.deploymentId)), caller);
      },

      async getDeploymentLogs(req) {
        const caller = requireCaller(req.caller);
        const a = await ctx.read((em) => getDeployment(em, caller, req.deploymentId));
        return {
          deploymentId: a.id,
          appName: a.appName,
          status: deploymentStatus(a),
          phases: deploymentPhases(a),
          errorMessage: opt(a.errorMessage),
          crashOutputJson: a.result?.crash_output ? JSON.stringify(a.result.crash_output) : "",
        };
      },

      async listHistory(req) {
        const caller = requireCaller(req.caller);
        const page = await ctx.read((em) => listHistory(em, caller, { appName: req.appName, branch: req.branch, limit: req.limit, offset: req.offset }));
        return {
          items: page.items.map((h) => ({
            id: h.id,
            deploymentId: h.deploymentId,
            appName: h.appName,
            branch: h.branch,
            imageTag: opt(h.imageTag),
            previousTag: opt(h.previousTag),
            status: h.status,
            durationSeconds: h.durationSeconds ?? undefined,
            envVarsSnapshotJson: JSON.stringify(h.envVarsSnapshot ?? {}),
            createdBy: h.createdBy,
            startedAt: iso(h.startedAt),
            completedAt: iso(h.completedAt),
          })),
          total: page.total,
        };
      },

      async queueAppAction(req) {
        const caller = requireCaller(req.caller);
        const now = new Date();
        const dispatched: Dispatched[] = [];
        const type = req.actionType;
        let branch = req.branch;
        if (type === "UNDEPLOY") {
          const { branches } = await apps.listBranches({ caller, appName: req.appName });
          branch = undeployBranch(req.appName, branches, req.branch);
        }
        const app = await apps.getApp({ caller, appName: req.appName, branch });
        const target = { groupSlug: app.groupSlug, appName: app.appName, branch: app.branch };
        let result: { actions: Action[]; services: string[]; skippedStatic: string[]; skippedNotDeployed: string[] };
        switch (type) {
          case "UNDEPLOY":
          case "RECONCILE_ROUTING": {
            const action = await ctx.write(async (em) => {
              // Undeploy twice: the second is answered with the first while it is still queued.
              const pending = type === "UNDEPLOY" ? await pendingUndeploy(em, caller, target, req.purge) : null;
              const queued =
                pending ??
                (await queueAppAction(
                  em,
                  caller,
                  {
                    ...target,
                    actionType: type,
                    purge: req.purge,
                    imageTag: app.runningVersion ?? null,
                    // purge: the images of exactly this branch's builds go, wherever they are kept.
                    payload: type === "UNDEPLOY" && req.purge ? { purge_tags: await branchBuildTags(em, target) } : undefined,
                  },
                  now,
                  dispatched,
                ));
              if (type === "UNDEPLOY" && req.purge) await cancelBuildsOfPurgedBranch(em, target, queued.id, now);
              return queued;
            });
            result = { actions: [action], services: [], skippedStatic: [], skippedNotDeployed: [] };
            break;
          }
          case "RETRY": {
            const release = (imageTag: string) => apps.resolveRelease({ caller: inGroup(caller, target.groupSlug), appName: target.appName, branch: target.branch, imageTag });
            // A quarantined app is told its remediation first (spec section 7), whatever there is to retry.
            if (app.preflightStatus !== "ready" && app.preflightStatus !== "exempt") await release("");
            const registeredAt = app.createdAt ? new Date(app.createdAt) : null;
            const failed = await ctx.read((em) => retryTarget(em, target.groupSlug, target.appName, target.branch, registeredAt));
            // The quarantine and the image are checked as for any deploy.
            await release(failed.imageTag ?? "");
            const action = await ctx.write(async (em) => {
              await lockedRetryTarget(em, target.groupSlug, target.appName, target.branch, registeredAt);
              return queueAppAction(
                em,
                caller,
                { ...target, actionType: "RETRY", imageTag: failed.imageTag, commitMessage: failed.commitMessage, commitAuthor: failed.commitAuthor, payload: { retry_of: failed.id, failed_phase: failed.phase ?? null, previous_tag: app.runningVersion ?? null, services: failed.payload?.services ?? null } },
                now,
                dispatched,
              );
            });
            result = { actions: [action], services: [], skippedStatic: [], skippedNotDeployed: [] };
            break;
          }
          case "SERVICE_ACTION": {
            if (!["restart", "stop", "start"].includes(req.action)) throw PlatformError.invalid("action must be restart, stop or start.");
            const running = app.deployStatus !== "undeployed" && Boolean(app.runningVersion);
            // What the app declares is said before whether anything runs (spec doc 2 section 4.10:
            // a static service is refused 422, an undeclared one 404).
            const config = await declaredConfig(apps, caller, app);
            const shapes = config ? serviceShapes(config, app.services.map((s) => s.name)) : [];
            const deployed = running ? new Set(app.services.filter((s) => s.inServingRelease).map((s) => s.name)) : null;
            const targets = config ? serviceTargets(app.appName, shapes, req.services[0] ?? null, deployed) : null;
            if (!running || !targets || targets.services.length === 0) {
              throw PlatformError.conflict({ code: "nothing_running", message: `Nothing runs on branch '${app.branch}' of '${app.appName}': deploy it first.` });
            }
            const actions = await ctx.write(async (em) => {
              const out: Action[] = [];
              for (const service of targets.services) {
                out.push(
                  await queueAppAction(em, caller, { ...target, actionType: "SERVICE_ACTION", serviceName: service, action: req.action as "restart", imageTag: app.runningVersion ?? null }, now, dispatched),
                );
              }
              return out;
            });
            result = { actions, services: targets.services, skippedStatic: targets.skippedStatic, skippedNotDeployed: targets.skippedNotDeployed };
            break;
          }
          default:
            throw PlatformError.invalid(`Unknown app action '${type}'.`);
        }
        await publishDispatched(ctx, dispatched);
        return {
          actionIds: result.actions.map((a) => a.id),
          appName: target.appName,
          branch: target.branch,
          status: "queued",
          imageTag: result.actions[0]?.imageTag ?? undefined,
          services: result.services,
          skippedStatic: result.skippedStatic,
          skippedNotDeployed: result.skippedNotDeployed,
        };
      },

      async getServicesStatus(req) {
        const caller = requireCaller(req.caller);
        const app = await apps.getApp({ caller, appName: req.appName, branch: req.branch });
        const isStatic = (await declaredConfig(apps, caller, app).catch(() => null))?.type === "static";
        // An operator who named no group may mean another group's app of that name and branch.
        const ambiguous =
          spansEveryGroup(caller) &&
          new Set(
            (await apps.listBranches({ caller, appName: req.appName }).catch(() => ({ branches: [] }))).branches
              .filter((b) => b.branch === app.branch)
              .map((b) => b.groupSlug),
          ).size > 1;
        // The agents' reports are read as the status's last input; failing, they make it unknown (read_failed), not an error.
        const agents = await ctx
          .read((em) => em.find(Agent, {}))
          .then((rows) => rows.map((a) => ({ hostId: a.hostId, lastSeen: a.lastSeen, facts: a.facts ?? {} })))
          .catch((err: unknown) => {
            ctx.logger.warn({ err }, "could not read the agents' reports for a services status");
            return null;
          });
        const views = servicesStatus({ groupSlug: app.groupSlug, appName: app.appName, branch: app.branch, isStatic }, app.services.map((s) => s.name), {
          agents,
          ambiguous,
          floor: opts.fleetFloor,
          now: new Date(),
        });
        const urls = new Map(app.services.map((s) => [s.name, s.url]));
        return {
          appName: app.appName,
          branch: app.branch,
          services: views.map((v) => ({
            name: v.name,
            status: v.status,
            runtime: {
              replicasRunning: v.runtime.replicas_running ?? undefined,
              hostsUnverified: v.runtime.hosts_unverified ?? undefined,
              reason: v.runtime.reason ?? undefined,
            },
            url: urls.get(v.name) ?? undefined,
            httpClient: v.http_client ?? undefined,
            capabilityProbedAt: v.capability_probed_at ?? undefined,
          })),
        };
      },

      async scaleService(req) {
        const caller = requireCaller(req.caller);
        const { branches } = await apps.listBranches({ caller, appName: req.appName });
        const branch = scaleBranch(branches, req.branch);
        const app = await apps.getApp({ caller, appName: req.appName, branch });
        const target = { groupSlug: app.groupSlug, appName: app.appName, branch: app.branch };
        if (!app.services.some((s) => s.name === req.service)) {
          throw PlatformError.notFound({ code: "service_not_declared", message: `App '${app.appName}' (branch ${app.branch}) declares no service '${req.service}'.`, service: req.service });
        }
        // One transaction, serialized per branch by lockScaleTarget, from the in-flight check through
        // the queued DEPLOY: a concurrent scale waits for it, then is refused (scale_in_flight)
        // before apps-builds saves anything. It is held open across the save and resolveRelease RPCs
        // (two short calls; scale is rare). ctx.write does not retry, so each RPC runs once.
        let saved = null as Awaited<ReturnType<typeof apps.setServiceReplicas>> | null;
        const dispatched: Dispatched[] = [];
        const done = await ctx
          .write(async (em) => {
            await lockScaleTarget(em, target);
            await refuseScaleInFlight(em, target);
            const s = await apps.setServiceReplicas({ caller, appName: app.appName, branch: app.branch, service: req.service, replicas: req.replicas });
            saved = s;
            if (s.noop) return { saved: s, action: null };
            const release = await apps.resolveRelease({ caller: inGroup(caller, app.groupSlug), appName: app.appName, branch: app.branch, imageTag: app.runningVersion ?? "", skipPreflight: true });
            const action = await queueDeployment(
              em,
              caller,
              { appName: release.appName, branch: release.branch, groupSlug: release.groupSlug, imageTag: release.imageTag, buildId: release.buildId, configPath: release.configPath, runningVersion: release.runningVersion },
              { services: null, placementPlan: null, reason: "scale" },
              new Date(),
              dispatched,
            );
            return { saved: s, action };
          })
          .catch(async (err: unknown): Promise<never> => {
            // Failing before the save (or on a no-op), nothing was saved: the error as is. After it, the count stays saved.
            if (!saved || saved.noop) throw err;
            const deployed = await ctx.read((em) => deployedReplicas(em, target, req.service, new Date())).catch(() => null);
            throw scaleSavedNotDeployed(err instanceof ConnectError ? fromConnectError(err) : err, { requested: saved.requested, previous: saved.previous, deployed });
          });
        const s = done.saved;
        const base = { appName: s.appName, branch: s.branch, service: s.service, previous: s.previous, requested: s.requested, overlayPaths: s.overlayPaths, imageTag: s.imageTag };
        if (!done.action) {
          const deployed = await ctx.read((em) => deployedReplicas(em, target, req.service, new Date()));
          return { ...base, actionId: "", noop: true, deployed: deployed ?? undefined };
        }
        await publishDispatched(ctx, dispatched);
        return { ...base, actionId: done.action.id, noop: false };
      },

      async claimAction(req) {
        const now = new Date();
        const r = await ctx.write((em) => claimAction(em, req.actionId, req.hostId, now));
        return {
          claimed: r.claimed,
          refusalReason: r.refusalReason,
          drop: r.drop,
          blockingActionId: r.admission?.verdict === "refuse" ? (r.admission.blockingActionId ?? "") : "",
          action: r.claimed ? await view(r.action, now) : undefined,
          resumed: r.admission?.verdict === "resume",
        };
      },

      async reportProgress(req) {
        return ctx.write((em) => reportProgress(em, { actionId: req.actionId, hostId: req.hostId, phase: req.phase, message: req.message, commit: req.commit }, new Date()));
      },

      async completeAction(req) {
        await ctx.write((em) =>
          completeAction(em, { actionId: req.actionId, hostId: req.hostId, status: req.status, errorMessage: req.errorMessage, resultJson: req.resultJson }, new Date()),
        );
        return {};
      },
    });
  };
}
