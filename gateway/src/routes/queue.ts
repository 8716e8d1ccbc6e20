/**
 * The deploy queue (spec doc 1 sections 2.5 and 4.5): listing, one action, diagnose, prioritize,
 * admit-force, and cancel. deploy-queue enforces tenancy; these routes translate.
 */
import type { FastifyInstance } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { Action, DeployQueueService } from "@platform/proto";
import { callerOf } from "../access.ts";
import { authErrors, bodyErrors, commonQuery, INT32_MAX } from "../schemas.ts";

const orNull = <T>(v: T | undefined) => (v === undefined || v === "" ? null : v);

/** A queue row in the 2.5 shape, plus the live lifecycle fields. */
export function queueRowJson(a: Action) {
  return {
    action_id: a.actionId,
    app_name: a.appName,
    branch: a.branch,
    action_type: a.actionType,
    status: a.status,
    image_tag: orNull(a.imageTag),
    commit_message: orNull(a.commitMessage),
    commit_author: orNull(a.commitAuthor),
    depends_on: orNull(a.dependsOn),
    auto_deploy: a.autoDeploy,
    admission_check_reason: orNull(a.admissionCheckReason),
    last_admission_check_at: orNull(a.lastAdmissionCheckAt),
    stuck_class: orNull(a.stuckClass),
    deploy_warnings: a.deployWarnings,
    service_name: orNull(a.serviceName),
    action: orNull(a.action),
    created_at: a.createdAt,
    updated_at: a.updatedAt,
    queue_status: a.queueStatus,
    phase: orNull(a.phase),
    error_message: orNull(a.errorMessage),
    group_slug: a.groupSlug,
    priority: a.priority,
    cancel_requested: a.cancelRequested,
    completed_at: orNull(a.completedAt),
  };
}

function parseResult(json: string): Record<string, unknown> | null {
  if (!json) return null;
  try {
    return JSON.parse(json) as Record<string, unknown>;
  } catch {
    return null;
  }
}

const nullable = { type: ["string", "null"] } as const;
const queueRowProperties = {
  action_id: { type: "string", format: "uuid" },
  app_name: { type: "string" },
  branch: { type: "string" },
  action_type: {
    type: "string",
    description:
      "BUILD, DEPLOY, RETRY, SERVICE_ACTION, UNDEPLOY, RECONCILE_ROUTING, GIT_PREFLIGHT, ... A GIT_PREFLIGHT row records a preflight (the `preflight_action_id` of " +
      "register, PATCH config_path, save-config and recheck): a fast request to any agent outside the deploy lane, never claimed or gated; it ends `completed` when an agent " +
      "answered (the answer is the app's `preflight_status` and `preflight_result`), or `cancelled` (`error_message` says why) when a newer preflight or the " +
      "app's deletion came first.",
  },
  status: { type: "string", enum: ["queued", "in_progress", "completed", "failed", "cancelled"] },
  image_tag: nullable,
  commit_message: nullable,
  commit_author: nullable,
  depends_on: { ...nullable, description: "The action this one waits for (a deploy queued with its build points at the build)." },
  auto_deploy: { type: "boolean" },
  admission_check_reason: { ...nullable, description: "Why the agent last refused to claim it; cleared on a successful claim." },
  last_admission_check_at: { ...nullable, description: "When the admission gates were last evaluated for it." },
  stuck_class: {
    type: ["string", "null"],
    enum: ["never_claimed", "admission_refused", "in_progress", "build_in_progress", null],
    description:
      "Why a live action is not moving, computed on read. `build_in_progress`: queued behind its dependency (a deploy behind its build), still live; " +
      "`admission_refused`: queued, and the agent's last claim was refused (`admission_check_reason`); `never_claimed`: queued over 2 minutes with no claim tried; " +
      "`in_progress`: claimed, and no report from its agent for over 2 minutes, or for over a minute while its host sends no heartbeat either " +
      "(after 3 minutes without progress from a silent host it is failed; a deploy past its swap commit is recorded completed, as it rolls forward). Null while it moves normally, and for finished actions.",
  },
  deploy_warnings: { type: "array", items: { type: "string" }, description: "Non-default decisions the agent applied." },
  service_name: { ...nullable, description: "SERVICE_ACTION rows only." },
  action: { type: ["string", "null"], enum: ["restart", "stop", "start", null], description: "SERVICE_ACTION rows only." },
  created_at: { type: "string", format: "date-time" },
  updated_at: { type: "string", format: "date-time" },
  queue_status: { type: "string", description: "Live lifecycle: for builds queued, build_in_progress, build_completed, build_failed, build_cancelled." },
  phase: { ...nullable, description: "The agent's current or last phase." },
  error_message: nullable,
  group_slug: { type: "string" },
  priority: { type: "integer", description: "Raised by prioritize; orders admission where a host has fewer free slots than waiting actions." },
  cancel_requested: { type: "boolean", description: "A cancel was requested while it was in flight." },
  completed_at: nullable,
} as const;
const queueRowRequired = Object.keys(queueRowProperties);
const queueRowSchema = { type: "object", properties: queueRowProperties, required: queueRowRequired } as const;
const queueActionSchema = {
  type: "object",
  properties: { ...queueRowProperties, result: { type: ["object", "null"], additionalProperties: true, description: "What the agent reported when it finished (per-phase output, commit, images). Where it ran (`host`, `runtime`, `instance_status`) is shown to platform operators only, as on deployments; the variables a deploy ran with only by its deployment history (GET /api/deployments/history)." } },
  required: [...queueRowRequired, "result"],
} as const;

const actionIdParams = {
  type: "object",
  properties: { action_id: { type: "string", description: "The id or a prefix of at least 8 hex-or-hyphen characters." } },
  required: ["action_id"],
} as const;

export function queueRoutes(app: FastifyInstance, queue: Client<typeof DeployQueueService>): void {
  app.get(
    "/api/deployments/queue",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "The deploy queue of the group you act in (operators: every group unless one is selected), newest first. A bare array.",
        description: "Live rows (queued, in_progress) unless `all`. Ask for limit plus one row to detect truncation.",
        querystring: {
          type: "object",
          properties: {
            ...commonQuery,
            app_name: { type: "string" },
            all: { type: "boolean", default: false, description: "Include terminal rows (completed, failed, cancelled)." },
            exclude_types: {
              type: "array",
              items: { type: "string" },
              description: "Action types to leave out: a comma list (may be repeated). No default; unknown types change nothing.",
            },
            limit: { type: "integer", minimum: 1, maximum: 500, default: 100 },
          },
        },
        response: { 200: { type: "array", items: queueRowSchema }, ...authErrors },
      },
    },
    async (request) => {
      const q = request.query as { app_name?: string; all: boolean; exclude_types?: string[]; limit: number };
      const r = await queue.listQueue({
        caller: callerOf(request),
        appName: q.app_name ?? "",
        all: q.all,
        excludeTypes: (q.exclude_types ?? []).flatMap((t) => t.split(",")).map((t) => t.trim()).filter(Boolean),
        limit: q.limit,
      });
      return r.items.map(queueRowJson);
    },
  );

  app.post(
    "/api/deployments/queue/prioritize",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["deployments"],
        summary: "Move work to the front: every queued or running action of an app, or one action (a build with its dependent deploy).",
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            target: { type: "string", minLength: 1, maxLength: 255, description: "An app slug (any case), or an action id prefix (at least 8 hex-or-hyphen characters); inside your group." },
          },
          required: ["target"],
        },
        response: {
          200: {
            type: "object",
            properties: { target: { type: "string" }, action_ids: { type: "array", items: { type: "string" } }, prioritized: { type: "integer" } },
            required: ["target", "action_ids", "prioritized"],
          },
          409: { $ref: "Error#", description: "`action_finished`: the action is already terminal." },
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request) => {
      const { target } = request.body as { target: string };
      const r = await queue.prioritize({ caller: callerOf(request), target });
      return { target, action_ids: r.actionIds, prioritized: r.actionIds.length };
    },
  );

  app.get(
    "/api/deployments/queue/:action_id",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "One queue action by id or id prefix, authorised against the group that owns it.",
        params: actionIdParams,
        querystring: { type: "object", properties: commonQuery },
        response: { 200: queueActionSchema, ...authErrors },
      },
    },
    async (request) => {
      const { action_id } = request.params as { action_id: string };
      const a = await queue.getAction({ caller: callerOf(request), actionId: action_id });
      return { ...queueRowJson(a), result: parseResult(a.resultJson) };
    },
  );

  app.get(
    "/api/deployments/queue/:action_id/diagnose",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["deployments"],
        summary: "Read-only narrative on why an action is, or is not, moving: state, admission gates, dependency, blocking action, one hint.",
        params: actionIdParams,
        querystring: { type: "object", properties: commonQuery },
        response: {
          200: {
            type: "object",
            properties: {
              action_id: { type: "string" },
              status: { type: "string" },
              stuck_class: queueRowProperties.stuck_class,
              narrative: { type: "string" },
              hint: { type: "string" },
              blocking_action_id: nullable,
              action: queueRowSchema,
            },
            required: ["action_id", "status", "stuck_class", "narrative", "hint", "blocking_action_id", "action"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { action_id } = request.params as { action_id: string };
      const d = await queue.diagnoseAction({ caller: callerOf(request), actionId: action_id });
      const row = queueRowJson(d.action!);
      return {
        action_id: row.action_id,
        status: row.status,
        stuck_class: row.stuck_class,
        narrative: d.narrative,
        hint: d.hint,
        blocking_action_id: orNull(d.blockingActionId),
        action: row,
      };
    },
  );

  app.post(
    "/api/deployments/queue/:action_id/admit-force",
    {
      config: { access: { scope: "admin" } },
      schema: {
        tags: ["deployments"],
        summary: "Single-use admission override: the agent admits this queued action past the capacity gates on its next poll.",
        description:
          "Platform operators, or admins of the group owning the action. `ttl_seconds` is clamped to 60-3600. " +
          "The capacity gates are the per-host concurrency limit and the queue order among actions waiting for a host's free slots " +
          "(spec 4.5 names the database-connection budget gate, which comes with managed databases). The gates that keep the queue correct are never passed: " +
          "an action still waits for its dependency (its build), for the action of its app and branch in flight, and, for an undeploy with purge, for a build of the branch to end; " +
          "`admission_check_reason` on the action says which one holds it. Each call grants a new override that replaces the last.",
        params: actionIdParams,
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            reason: { type: "string", maxLength: 500, description: "Required: why the action may pass." },
            ttl_seconds: { type: "integer", default: 300, description: "How long the override waits for a claim; clamped to 60-3600." },
          },
          required: ["reason"],
        },
        response: {
          200: {
            type: "object",
            properties: {
              action_id: { type: "string" },
              reason: { type: "string" },
              ttl_seconds: { type: "integer" },
              expires_at: { type: "string", format: "date-time" },
              single_use: { type: "boolean" },
            },
            required: ["action_id", "reason", "ttl_seconds", "expires_at", "single_use"],
          },
          ...authErrors,
          404: { $ref: "Error#", description: "The same answer for an unknown action, another group's, and a malformed or too short id (spec 4.5)." },
          ...bodyErrors,
          400: {
            $ref: "Error#",
            description:
              "`not_queued`: the action is no longer queued (`status` echoes its current status); `not_gated`: a fast request (GIT_PREFLIGHT) that no admission gate holds; or malformed JSON.",
          },
        },
      },
    },
    async (request) => {
      const { action_id } = request.params as { action_id: string };
      const body = request.body as { reason: string; ttl_seconds?: number };
      // Any whole number is clamped by the queue; one beyond the message's int32 is brought within it first.
      const ttlSeconds = body.ttl_seconds === undefined ? undefined : Math.max(-INT32_MAX - 1, Math.min(INT32_MAX, body.ttl_seconds));
      const g = await queue.admitForce({ caller: callerOf(request), actionId: action_id, reason: body.reason, ttlSeconds });
      return { action_id: g.actionId, reason: body.reason.trim(), ttl_seconds: g.ttlSeconds, expires_at: g.expiresAt, single_use: true };
    },
  );

  app.post(
    "/api/deployments/:deployment_id/cancel",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["deployments"],
        summary: "Cancel a queued or in-flight action. Always 200: branch on `status`.",
        description:
          "`cancelled` (was queued; its dependents too, listed in `dependents_cancelled`), `cancel_requested` (in flight: the agent stops between phases), " +
          "`refused_past_point_of_no_return` (a deploy past its swap commit rolls forward; a build whose commands have run and which is packaging its image completes; an undeploy, service action or route reconcile in flight is one step and finishes), `not_found`, `not_cancellable` (already terminal, or a GIT_PREFLIGHT, which an agent is asked at once). " +
          "Cancelling a build cascades to its dependent deploy. A build cancelled by its full id right after the 202 of `POST /api/builds`, before the queue shows it, " +
          "is cancelled all the same (with its deploy).",
        params: {
          type: "object",
          properties: { deployment_id: { type: "string", description: "The action id (a deployment, build or other action), or a prefix of at least 8 characters." } },
          required: ["deployment_id"],
        },
        querystring: { type: "object", properties: commonQuery },
        body: { type: ["object", "null"], properties: { reason: { type: "string", maxLength: 500 } } },
        response: {
          200: {
            type: "object",
            properties: {
              deployment_id: { type: "string" },
              status: { type: "string", enum: ["cancelled", "cancel_requested", "refused_past_point_of_no_return", "not_found", "not_cancellable"] },
              cancelled: { type: "boolean", description: "Whether the action is now cancelled, by this call or an earlier one (a repeated cancel: `not_cancellable` with `cancelled` true)." },
              cancel_requested: { type: "boolean", description: "Whether a cancel was asked of the action in flight, by this call or an earlier one." },
              queue_status: nullable,
              dependents_cancelled: { type: "array", items: { type: "string" } },
              app_name: nullable,
            },
            required: ["deployment_id", "status", "cancelled", "cancel_requested", "queue_status", "dependents_cancelled", "app_name"],
          },
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request) => {
      const { deployment_id } = request.params as { deployment_id: string };
      const body = (request.body ?? {}) as { reason?: string };
      const r = await queue.cancelAction({ caller: callerOf(request), actionId: deployment_id, reason: body.reason ?? "" });
      return {
        deployment_id: r.actionId,
        status: r.status,
        cancelled: r.cancelled,
        cancel_requested: r.cancelRequested,
        queue_status: orNull(r.queueStatus),
        dependents_cancelled: r.dependentsCancelled,
        app_name: orNull(r.appName),
      };
    },
  );
}
