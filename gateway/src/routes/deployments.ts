/**
 * Deployments (spec doc 1 sections 2.4, 3.2, 4.5): queue one, list, history, one, its per-phase
 * logs, and undeploy. deploy-queue owns them (asking apps-builds what a release is); these
 * routes translate.
 */
import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { Deployment, DeployQueueService, HealthAggregatorService } from "@platform/proto";
import { callerOf } from "../access.ts";
import { LIVE_TAIL_LIMIT } from "../domain/build-log.ts";
import { phasesOfShippedLines } from "../domain/deploy-log.ts";
import { authErrors, bodyErrors, commonQuery, offsetParam, refusal } from "../schemas.ts";

/** The settings POST /api/deployments takes for `type: static` apps only. */
const STATIC_SITE_FIELDS = ["aliases", "record_fqdn", "cert_arn_us_east_1", "spa_fallback", "index_document", "error_document"] as const;
const orNull = <T>(v: T | undefined) => (v === undefined || v === "" ? null : v);
const jsonOrNull = (text: string): unknown => (text ? JSON.parse(text) : null);
const nullable = { type: ["string", "null"] } as const;
const operatorOnly = { type: ["object", "null"], additionalProperties: true, description: "Platform operators only; null for tenants." } as const;

export const DEPLOYMENT_STATUSES = ["queued", "setup_in_progress", "ready_to_deploy", "in_progress", "running", "completed", "failed", "cancelled", "undeploying"];

export function deploymentJson(d: Deployment) {
  return {
    id: d.id,
    deployment_id: d.deploymentId,
    app_name: d.appName,
    branch: d.branch,
    image_tag: orNull(d.imageTag),
    status: d.status,
    phase: orNull(d.phase),
    previous_tag: orNull(d.previousTag),
    action_type: d.actionType,
    error_message: orNull(d.errorMessage),
    created_by: d.createdBy,
    created_at: d.createdAt,
    updated_at: d.updatedAt,
    completed_at: orNull(d.completedAt),
    placement_plan: jsonOrNull(d.placementPlanJson),
    instance_status: jsonOrNull(d.instanceStatusJson),
    leader_instance: orNull(d.leaderInstance),
    infrastructure: jsonOrNull(d.infrastructureJson),
  };
}

const deploymentProperties = {
  id: { type: "string", format: "uuid" },
  deployment_id: { type: "string", format: "uuid" },
  app_name: { type: "string" },
  branch: { type: "string" },
  image_tag: nullable,
  status: {
    type: "string",
    enum: DEPLOYMENT_STATUSES,
    description:
      "queued; setup_in_progress (the agent fetches, starts and health-checks the new colour); ready_to_deploy (its checks passed); " +
      "in_progress (the swap is committed, the route moves); running (the new release serves while the old colour drains); " +
      "completed, failed or cancelled once finished. An undeploy is undeploying from its acceptance (queued) until it finishes.",
  },
  phase: { ...nullable, description: "The agent's phase of a DEPLOY or RETRY: setup, start, health_check, ready, swap_committed, drain. An UNDEPLOY is one step and reports none (null)." },
  previous_tag: { ...nullable, description: "The tag that served when the deployment was queued." },
  action_type: { type: "string", enum: ["DEPLOY", "RETRY", "UNDEPLOY"] },
  error_message: nullable,
  created_by: { type: "string" },
  created_at: { type: "string", format: "date-time" },
  updated_at: { type: "string", format: "date-time" },
  completed_at: nullable,
  placement_plan: operatorOnly,
  instance_status: {
    ...operatorOnly,
    description:
      "Platform operators only; null for tenants. Each host's state of this deployment's replicas when the deployment ended (`{host: \"running\"}`): " +
      "a record of that moment, not kept up to date (a later deploy's drain does not change it; GET /api/services/{app} says what runs now).",
  },
  leader_instance: { ...nullable, description: "Platform operators only; null for tenants." },
  infrastructure: operatorOnly,
} as const;
const deploymentSchema = { type: "object", properties: deploymentProperties, required: Object.keys(deploymentProperties) } as const;

const historyProperties = {
  id: { type: "string", format: "uuid" },
  deployment_id: { type: "string", format: "uuid" },
  app_name: { type: "string" },
  branch: { type: "string" },
  image_tag: nullable,
  previous_tag: nullable,
  status: { type: "string" },
  duration_seconds: { type: ["integer", "null"] },
  env_vars_snapshot: { type: "object", additionalProperties: { type: "string" }, description: "The variables the release ran with." },
  created_by: { type: "string" },
  started_at: nullable,
  completed_at: nullable,
} as const;

const page = {
  limit: { type: "integer", minimum: 1, maximum: 200, default: 50 },
  offset: offsetParam,
} as const;

/** POST /api/deployments answers validation 400 (doc 1 section 4.5), never 422. */
const { 422: _validation, ...accessErrors } = authErrors;

const idParams = {
  type: "object",
  properties: { deployment_id: { type: "string", description: "The id or a prefix of at least 8 hex-or-hyphen characters." } },
  required: ["deployment_id"],
} as const;

export function deploymentRoutes(app: FastifyInstance, queue: Client<typeof DeployQueueService>, health: Client<typeof HealthAggregatorService>): void {
  app.post(
    "/api/deployments",
    {
      config: { access: { scope: "deploy" }, invalidIs400: true },
      schema: {
        tags: ["deployments"],
        summary: "Queue a deployment of a built image (default: the branch's latest successful build).",
        description:
          "400 for every validation failure: a body or query the schema refuses, no successful build for the tag, a service the release does not declare, " +
          "static-site fields for an app that is not static, a placement plan naming no agent host; 404 app not in scope; 409 quarantined by preflight, or the app and branch exist in several groups " +
          "(callers seeing every group: retry with ?group=). The agent starts the new colour beside the old, health-checks it, flips the route (the swap commit) and stops the old colour.",
        querystring: { type: "object", properties: { ...commonQuery, skip_preflight: { type: "boolean", default: false } } },
        body: {
          type: "object",
          properties: {
            app_name: { type: "string", minLength: 1, maxLength: 128 },
            branch: { type: "string", minLength: 1, maxLength: 255, default: "main" },
            image_tag: { type: "string", minLength: 1, maxLength: 300 },
            services: {
              type: "array",
              items: { type: "string" },
              description: "Names of services the release's config declares, to deploy only those; every service when omitted or empty. The other services the config declares keep running the release they run (their replicas are not restarted). A name it does not declare is 400 `service_not_declared`.",
            },
            placement_plan: {
              type: "object",
              additionalProperties: true,
              description:
                "Platform operators only (403 for anyone else): `{host}`, the agent host id to deploy on (400 for another key or a host the platform has never heard from). " +
                "A host that is not live and schedulable is passed over: the deploy is placed as usual and its `deploy_warnings` say so.",
            },
            aliases: {
              type: "array",
              items: { type: "string" },
              description: "This and the five fields after it are for `type: static` apps only: sent for another app, 400 `static_site_fields` naming them.",
            },
            record_fqdn: { type: "string" },
            cert_arn_us_east_1: { type: "string" },
            spa_fallback: { type: "boolean" },
            index_document: { type: "string" },
            error_document: { type: "string" },
          },
          required: ["app_name"],
          additionalProperties: false,
        },
        response: {
          202: {
            type: "object",
            properties: {
              deployment_id: { type: "string" },
              action_id: { type: "string" },
              status: { type: "string", enum: ["queued"] },
              pg_id: { type: "string", description: "The Postgres row id of the queue action (the same uuid)." },
              image_tag: { type: "string" },
              branch: { type: "string" },
            },
            required: ["deployment_id", "action_id", "status", "pg_id"],
          },
          ...accessErrors,
          ...bodyErrors,
          400: refusal("Validation failed (`{detail: {code: invalid_request, message, errors}}` for the schema's refusals), or malformed JSON."),
          409: refusal("`preflight_quarantined`, with the remediation; or the app and branch exist in several groups and the caller sees every group (retry with ?group=). Nothing queued."),
        },
      },
    },
    async (request, reply) => {
      const body = request.body as { app_name: string; branch?: string; image_tag?: string; services?: string[]; placement_plan?: Record<string, unknown> };
      const { skip_preflight } = request.query as { skip_preflight: boolean };
      const r = await queue.queueDeployment({
        caller: callerOf(request),
        appName: body.app_name,
        branch: body.branch ?? "main",
        imageTag: body.image_tag ?? "",
        servicesJson: body.services ? JSON.stringify(body.services) : "",
        placementPlanJson: body.placement_plan ? JSON.stringify(body.placement_plan) : "",
        skipPreflight: skip_preflight,
        reason: "api",
        staticSiteFields: STATIC_SITE_FIELDS.filter((f) => (request.body as Record<string, unknown>)[f] !== undefined),
      });
      reply.code(202);
      return { deployment_id: r.deploymentId, action_id: r.actionId, status: r.status, pg_id: r.actionId, image_tag: r.imageTag, branch: r.branch };
    },
  );

  const branchFilter = { type: "string", description: "Only this branch's; omitted, every branch (as on GET /api/builds)." } as const;
  app.get(
    "/api/deployments",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "Deployments (DEPLOY, RETRY, UNDEPLOY) of the group you act in, newest first.",
        querystring: { type: "object", properties: { ...commonQuery, app_name: { type: "string" }, branch: branchFilter, ...page } },
        response: {
          200: { type: "object", properties: { items: { type: "array", items: deploymentSchema }, total: { type: "integer" } }, required: ["items", "total"] },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const q = request.query as { app_name?: string; branch?: string; limit: number; offset: number };
      const r = await queue.listDeployments({ caller: callerOf(request), appName: q.app_name ?? "", branch: q.branch ?? "", limit: q.limit, offset: q.offset });
      return { items: r.items.map(deploymentJson), total: r.total };
    },
  );

  app.get(
    "/api/deployments/history",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "The immutable history of an app's finished deployments, newest first.",
        querystring: { type: "object", properties: { ...commonQuery, app_name: { type: "string", minLength: 1 }, branch: branchFilter, ...page }, required: ["app_name"] },
        response: {
          200: {
            type: "object",
            properties: { items: { type: "array", items: { type: "object", properties: historyProperties, required: Object.keys(historyProperties) } }, total: { type: "integer" } },
            required: ["items", "total"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const q = request.query as { app_name: string; branch?: string; limit: number; offset: number };
      const r = await queue.listHistory({ caller: callerOf(request), appName: q.app_name, branch: q.branch ?? "", limit: q.limit, offset: q.offset });
      return {
        items: r.items.map((h) => ({
          id: h.id,
          deployment_id: h.deploymentId,
          app_name: h.appName,
          branch: h.branch,
          image_tag: orNull(h.imageTag),
          previous_tag: orNull(h.previousTag),
          status: h.status,
          duration_seconds: h.durationSeconds ?? null,
          env_vars_snapshot: jsonOrNull(h.envVarsSnapshotJson) ?? {},
          created_by: h.createdBy,
          started_at: orNull(h.startedAt),
          completed_at: orNull(h.completedAt),
        })),
        total: r.total,
      };
    },
  );

  app.get(
    "/api/deployments/:deployment_id",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "One deployment; 404 when unknown or another group's.",
        params: idParams,
        querystring: { type: "object", properties: commonQuery },
        response: { 200: deploymentSchema, ...authErrors },
      },
    },
    async (request) => {
      const { deployment_id } = request.params as { deployment_id: string };
      return deploymentJson(await queue.getDeployment({ caller: callerOf(request), deploymentId: deployment_id }));
    },
  );

  app.get(
    "/api/deployments/:deployment_id/logs",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "Per-phase output of a deployment plus its error message.",
        description:
          "`phases` in order (setup, start, health_check, ready, swap_committed, drain; an UNDEPLOY's one phase is `undeploy`); `crash_output` maps a service to the last lines it wrote when it died during the health checks. " +
          `While the deployment is in flight, and when it ended without its agent's report (the agent stopped answering and the queue failed it), ` +
          `the phases are read from the lines its agent has shipped (the last ${LIVE_TAIL_LIMIT}). 404 unknown; 422 malformed id.`,
        params: idParams,
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: {
              deployment_id: { type: "string" },
              app_name: { type: "string" },
              status: { type: "string" },
              phases: { type: "array", items: { type: "object", properties: { name: { type: "string" }, output: { type: "string" } }, required: ["name", "output"] } },
              error_message: nullable,
              crash_output: { type: ["object", "null"], additionalProperties: { type: "array", items: { type: "string" } } },
            },
            required: ["deployment_id", "app_name", "status", "phases", "error_message", "crash_output"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { deployment_id } = request.params as { deployment_id: string };
      const caller = callerOf(request);
      const r = await queue.getDeploymentLogs({ caller, deploymentId: deployment_id });
      let phases = r.phases.map((p) => ({ name: p.name, output: p.output }));
      // The queue holds the phases once the agent has reported the end; until then (or if it never
      // does: the agent died and the queue failed the deployment) the agent's shipped lines have them.
      if (phases.length === 0) {
        const shipped = await health.queryLogs({ caller, deploymentId: r.deploymentId, source: "deploy", since: "7d", limit: LIVE_TAIL_LIMIT }).catch(() => null);
        if (shipped && !shipped.error) phases = phasesOfShippedLines(shipped.logs);
      }
      return {
        deployment_id: r.deploymentId,
        app_name: r.appName,
        status: r.status,
        phases,
        error_message: orNull(r.errorMessage),
        crash_output: jsonOrNull(r.crashOutputJson),
      };
    },
  );
}
