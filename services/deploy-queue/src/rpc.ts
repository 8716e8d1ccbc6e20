/** Connect handlers of deploy-queue: thin translations between protobuf and the domain. */
import type { ConnectRouter } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ActionSchema, DeployQueueService, type Action as ActionMsg } from "@platform/proto";
import { requireCaller } from "@platform/caller";
import type { ServiceContext } from "@platform/service";
import type { Action } from "./entities/index.ts";
import { admitForce } from "./domain/admit-force.ts";
import { cancelAction } from "./domain/cancel.ts";
import { claimAction, completeAction, reportProgress } from "./domain/claims.ts";
import { diagnoseAction } from "./domain/diagnose.ts";
import { queueStatus } from "./domain/lifecycle.ts";
import { getVisibleAction } from "./domain/lookup.ts";
import { prioritize } from "./domain/prioritize.ts";
import { listQueue, withStuckClass, type ActionView } from "./domain/queue.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : undefined);
const opt = (s: string | null | undefined) => (s === null || s === undefined ? undefined : s);

export function actionMsg({ action: a, stuckClass }: ActionView): ActionMsg {
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
    resultJson: a.result ? JSON.stringify(a.result) : "",
    queueStatus: queueStatus(a),
    cancelRequested: a.cancelRequested,
  });
}

export function routes(ctx: ServiceContext) {
  const view = async (action: Action | null, now: Date) =>
    action ? actionMsg((await ctx.read((em) => withStuckClass(em, [action], now)))[0]!) : undefined;

  return (router: ConnectRouter) => {
    router.service(DeployQueueService, {
      readiness: (req) => ctx.readiness(req),

      async listQueue(req) {
        const caller = requireCaller(req.caller);
        const rows = await ctx.read((em) =>
          listQueue(em, caller, { appName: req.appName, all: req.all, excludeTypes: req.excludeTypes, limit: req.limit, explicitGroup: req.explicitGroup }, new Date()),
        );
        return { items: rows.map(actionMsg) };
      },

      async getAction(req) {
        const caller = requireCaller(req.caller);
        const now = new Date();
        return ctx.read(async (em) => actionMsg((await withStuckClass(em, [await getVisibleAction(em, caller, req.actionId)], now))[0]!));
      },

      async diagnoseAction(req) {
        const caller = requireCaller(req.caller);
        const d = await ctx.read((em) => diagnoseAction(em, caller, req.actionId, new Date()));
        return { action: actionMsg(d.view), narrative: d.narrative, hint: d.hint, blockingActionId: d.blockingActionId ?? undefined };
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
        const o = await ctx.write((em) => cancelAction(em, caller, req.actionId, req.reason, new Date()));
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

      async claimAction(req) {
        const now = new Date();
        const r = await ctx.write((em) => claimAction(em, req.actionId, req.hostId, now));
        return {
          claimed: r.claimed,
          refusalReason: r.refusalReason,
          drop: r.drop,
          action: r.claimed ? await view(r.action, now) : undefined,
        };
      },

      async reportProgress(req) {
        return ctx.write((em) => reportProgress(em, { actionId: req.actionId, hostId: req.hostId, phase: req.phase, message: req.message }, new Date()));
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
