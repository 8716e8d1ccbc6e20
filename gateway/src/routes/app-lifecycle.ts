/**
 * What runs an app, as the API shows it (spec doc 1 sections 4.4 and 4.5, doc 2 section 4.10):
 * redeploy, retry, reconcile, undeploy, and the services (status, start, stop, restart).
 * deploy-queue queues the actions (asking apps-builds what the app is); these routes translate.
 *
 * Shapes the spec does not show (redeploy, retry, reconcile) answer 202 with the queued action:
 * `{action_id, deployment_id, app_name, branch, image_tag, status: queued}`; redeploy adds
 * `mode`: `image` (the latest successful build deployed again) or `rebuild` (a new build with
 * auto-deploy, when asked with `rebuild: true` or when the branch has no successful build yet).
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Client } from "@connectrpc/connect";
import type { AppsBuildsService, DeployQueueService } from "@platform/proto";
import { PlatformError } from "@platform/errors";
import { inGroup } from "@platform/caller";
import { callerOf } from "../access.ts";
import { appJson } from "./apps.ts";
import { authErrors, bodyErrors, commonQuery, refusal } from "../schemas.ts";

const nullable = { type: ["string", "null"] } as const;
const orNull = <T>(v: T | undefined) => (v === undefined || v === "" ? null : v);
const appParams = { type: "object", properties: { app_name: { type: "string" } }, required: ["app_name"] } as const;
const branchQuery = {
  type: "object",
  properties: { ...commonQuery, branch: { type: "string", description: "Branch of the app; defaults to the production branch." } },
} as const;

const queuedAction = {
  type: "object",
  properties: {
    action_id: { type: "string" },
    deployment_id: {
      ...nullable,
      description: "The deploy's id; null for a rebuild (its deploy is queued with the build: see the queue's depends_on) and for a route reconcile (no deployment).",
    },
    app_name: { type: "string" },
    branch: { type: "string" },
    image_tag: nullable,
    status: { type: "string", enum: ["queued"] },
    mode: { type: "string", enum: ["image", "rebuild"], description: "Redeploy only: whether the latest image is deployed again or the branch is rebuilt." },
    build_id: { ...nullable, description: "Redeploy only: the build a rebuild queued (null for an image redeploy)." },
  },
  required: ["action_id", "app_name", "branch", "status"],
} as const;

const runtimeSchema = {
  type: "object",
  properties: {
    replicas_running: { type: ["integer", "null"], description: "Hosts reporting a running replica (hosts, not containers)." },
    hosts_unverified: { type: ["integer", "null"], description: "Known hosts not heard from recently." },
    reason: { ...nullable, description: "Set only when status is unknown; the first that applies of read_failed, no_alive_agents, ambiguous_name, fleet_below_floor (FLEET_FLOOR), inventory_stale, host_silent." },
  },
  required: ["replicas_running", "hosts_unverified", "reason"],
  additionalProperties: false,
} as const;

/**
 * The scale body must be a JSON integer as sent: the gateway's schema validation would coerce
 * `"2"` or `true`, so the raw body is judged before it runs.
 */
async function strictReplicas(request: FastifyRequest): Promise<void> {
  const replicas = (request.body as { replicas?: unknown } | null)?.replicas;
  if (typeof replicas !== "number" || !Number.isInteger(replicas) || replicas < 1 || replicas > 3) {
    throw PlatformError.invalid({ code: "invalid_replicas", message: "replicas must be an integer from 1 to 3 (not a string or a boolean).", replicas: replicas ?? null });
  }
}

export function appLifecycleRoutes(app: FastifyInstance, apps: Client<typeof AppsBuildsService>, queue: Client<typeof DeployQueueService>): void {
  app.post(
    "/api/apps/:app_name/redeploy",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["apps"],
        summary: "Deploy the branch's latest image again, or rebuild and deploy.",
        description: "Body (optional): `rebuild` (boolean, default false). Without a successful build the branch is rebuilt. 409 while quarantined by preflight.",
        params: appParams,
        querystring: branchQuery,
        body: { type: ["object", "null"], properties: { rebuild: { type: "boolean", default: false } }, additionalProperties: false },
        response: { 202: queuedAction, ...authErrors, ...bodyErrors, 409: refusal("`preflight_quarantined`: the app is quarantined by its preflight, with the remediation (nothing queued).") },
      },
    },
    async (request, reply) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const rebuild = ((request.body ?? {}) as { rebuild?: boolean }).rebuild === true;
      const caller = callerOf(request);
      const current = await apps.getApp({ caller, appName: app_name, branch: branch ?? "" });
      if (!rebuild && current.latestBuild) {
        const r = await queue.queueDeployment({ caller: inGroup(caller, current.groupSlug), appName: current.appName, branch: current.branch, reason: "redeploy" });
        return reply.code(202).send({ action_id: r.actionId, deployment_id: r.deploymentId, app_name: r.appName, branch: r.branch, image_tag: r.imageTag, status: "queued", mode: "image", build_id: null });
      }
      const b = await apps.triggerBuild({ caller, appName: current.appName, repository: current.repository, branch: current.branch, autoDeploy: true, configPath: current.configPath });
      return reply
        .code(202)
        .send({ action_id: b.actionId, deployment_id: null, app_name: current.appName, branch: current.branch, image_tag: b.tag, status: "queued", mode: "rebuild", build_id: b.buildId });
    },
  );

  const simple = (path: string, type: "RETRY" | "RECONCILE_ROUTING", summary: string, description: string, conflicts: Record<number, ReturnType<typeof refusal>> = {}) =>
    app.post(
      path,
      {
        config: { access: { scope: "deploy" } },
        schema: {
          tags: ["apps"],
          summary,
          description,
          params: appParams,
          querystring: branchQuery,
          body: { type: ["object", "null"], properties: {}, additionalProperties: false, description: "No fields; an empty body or `{}`." },
          response: { 202: queuedAction, ...authErrors, ...bodyErrors, ...conflicts },
        },
      },
      async (request, reply) => {
        const { app_name } = request.params as { app_name: string };
        const { branch } = request.query as { branch?: string };
        const r = await queue.queueAppAction({ caller: callerOf(request), appName: app_name, branch: branch ?? "", actionType: type });
        // A retry is a deployment (GET /api/deployments/{id}); a route reconcile is not.
        const deploymentId = type === "RETRY" ? r.actionIds[0] : null;
        return reply.code(202).send({ action_id: r.actionIds[0], deployment_id: deploymentId, app_name: r.appName, branch: r.branch, image_tag: orNull(r.imageTag), status: r.status });
      },
    );
  simple(
    "/api/apps/:app_name/retry",
    "RETRY",
    "Retry the latest failed deploy of the branch (same image, phases from the start).",
    "409 while quarantined by preflight (said first, with the remediation); 409 `nothing_to_retry` when the latest deploy did not fail; " +
      "409 `build_not_completed` (with `build_id`) when it failed because its build failed or was cancelled: there is no image to deploy again.",
    { 409: refusal("`preflight_quarantined`, `nothing_to_retry` or `build_not_completed` (nothing queued).") },
  );
  simple(
    "/api/apps/:app_name/reconcile",
    "RECONCILE_ROUTING",
    "Re-assert the live route of the branch against its visibility.",
    "A private app loses its public route; a public one gets it back.",
  );

  app.patch(
    "/api/apps/:app_name/services/:service/replicas",
    {
      config: { access: { scope: "deploy" } },
      preValidation: strictReplicas,
      schema: {
        tags: ["apps"],
        summary: "Scale a service to 1-3 replicas: the count is saved as a dashboard config edit and the running image is deployed again with it.",
        description:
          "Branch omitted: the running branch, else production. A no-op (the service already declares that count) writes nothing: `action_id` null and `deployed` " +
          "(replicas running now, or null when unknown). Refusals `{detail: {code, message, ...}}`: 409 `nothing_running`; 409 `scale_in_flight` (action_id, action_type, status); " +
          "409 `overlay_would_drop_fields` (removed_paths); 409 `preflight_quarantined` while preflight quarantines the app (nothing saved); `scale_saved_not_deployed` (saved, requested, previous, deployed, reason) with the underlying status or 500; " +
          "404 unknown app, or `service_not_declared` for a service the running release does not declare (one only a later build has is scaled once that build is deployed); " +
          "422 replicas not an integer from 1 to 3. The preflight is not re-run (`preflight_action_id` is null). An edit for a service a later release no longer declares stays in the overlay and is left out of that release's effective config.",
        params: { type: "object", properties: { app_name: { type: "string" }, service: { type: "string" } }, required: ["app_name", "service"] },
        querystring: branchQuery,
        body: { type: "object", properties: { replicas: { type: "integer", minimum: 1, maximum: 3 } }, required: ["replicas"], additionalProperties: false },
        response: {
          200: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              branch: { type: "string" },
              service: { type: "string" },
              previous: { type: "integer" },
              requested: { type: "integer" },
              action_id: nullable,
              preflight_action_id: nullable,
              overlay_paths: { type: "array", items: { type: "string" } },
              image_tag: nullable,
              deployed: { type: ["integer", "null"], description: "No-op answers only." },
            },
            required: ["app_name", "branch", "service", "previous", "requested", "action_id", "preflight_action_id", "overlay_paths", "image_tag"],
          },
          ...authErrors,
          ...bodyErrors,
          409: refusal("`nothing_running`, `scale_in_flight`, `overlay_would_drop_fields` or `preflight_quarantined`: nothing saved or queued."),
          500: refusal("`scale_saved_not_deployed` (saved, requested, previous, deployed, reason): the count was saved, its deploy could not be queued; answered with the underlying status where there is one."),
        },
      },
    },
    async (request) => {
      const { app_name, service } = request.params as { app_name: string; service: string };
      const { branch } = request.query as { branch?: string };
      const { replicas } = request.body as { replicas: number };
      const r = await queue.scaleService({ caller: callerOf(request), appName: app_name, branch: branch ?? "", service, replicas });
      return {
        app_name: r.appName,
        branch: r.branch,
        service: r.service,
        previous: r.previous,
        requested: r.requested,
        action_id: orNull(r.actionId),
        preflight_action_id: null,
        overlay_paths: r.overlayPaths,
        image_tag: orNull(r.imageTag),
        ...(r.noop ? { deployed: r.deployed ?? null } : {}),
      };
    },
  );

  app.patch(
    "/api/apps/:app_name/primary-services",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["apps"],
        summary: "Per-service primary overrides, effective immediately: a service marked false keeps its URL but leaves the app's `urls`.",
        description: "Body `{primary: {<service_name>: boolean}}`; overrides merge with earlier ones. 404 for an undeclared service. Answers the app.",
        params: appParams,
        querystring: branchQuery,
        body: {
          type: "object",
          properties: { primary: { type: "object", additionalProperties: { type: "boolean" }, minProperties: 1 } },
          required: ["primary"],
          additionalProperties: false,
        },
        response: { 200: { $ref: "App#" }, ...authErrors, ...bodyErrors },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const { primary } = request.body as { primary: Record<string, boolean> };
      return appJson(await apps.setPrimaryServices({ caller: callerOf(request), appName: app_name, branch: branch ?? "", primary }), true);
    },
  );

  app.post(
    "/api/deployments/:app_name/undeploy",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["deployments"],
        summary: "Stop serving a branch: its route goes, then its processes.",
        description:
          "`branch` omitted: the branch that runs (several running: 409 naming one to choose; none: the production branch). `purge` also deletes the branch's images and builds: a build of the branch not yet ended is cancelled (with its deploy), and the undeploy waits for one in flight to stop. " +
          "Asked again while an undeploy of the branch is still queued (asked with the same `purge`, and nothing was queued for the branch since), the answer is that undeploy's `action_id`: nothing more is queued.",
        params: appParams,
        querystring: { type: "object", properties: commonQuery },
        body: { type: ["object", "null"], properties: { branch: { type: "string", minLength: 1 }, purge: { type: "boolean", default: false } }, additionalProperties: false },
        response: {
          202: {
            type: "object",
            properties: { action_id: { type: "string" }, app_name: { type: "string" }, branch: { type: "string" }, status: { type: "string", enum: ["queued"] }, purge: { type: "boolean" } },
            required: ["action_id", "app_name", "status", "purge"],
          },
          ...authErrors,
          ...bodyErrors,
          409: refusal("`branch_required`: the app runs on several branches, listed in `branches`; name one (nothing queued)."),
        },
      },
    },
    async (request, reply) => {
      const { app_name } = request.params as { app_name: string };
      const body = (request.body ?? {}) as { branch?: string; purge?: boolean };
      const r = await queue.queueAppAction({
        caller: callerOf(request),
        appName: app_name,
        branch: body.branch ?? "",
        actionType: "UNDEPLOY",
        purge: body.purge === true,
      });
      return reply.code(202).send({ action_id: r.actionIds[0], app_name: r.appName, branch: r.branch, status: r.status, purge: body.purge === true });
    },
  );

  app.get(
    "/api/services/:app_name",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["services"],
        summary: "Each service of a branch with its runtime status, derived from the agents' heartbeats.",
        description: "`status`: running, not_running, unknown (see `runtime.reason`), edge (static). A response without `runtime` comes from an older API: treat it as unknown.",
        params: appParams,
        querystring: branchQuery,
        response: {
          200: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              branch: { type: "string" },
              services: {
                type: "array",
                items: {
                  type: "object",
                  properties: {
                    name: { type: "string" },
                    status: { type: "string", enum: ["running", "not_running", "unknown", "edge"] },
                    runtime: runtimeSchema,
                    url: nullable,
                    http_client: { type: ["string", "null"], enum: ["curl", "python3", "node", "none", null] },
                    capability_probed_at: nullable,
                  },
                  required: ["name", "status", "runtime", "url", "http_client", "capability_probed_at"],
                },
              },
            },
            required: ["app_name", "branch", "services"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const r = await queue.getServicesStatus({ caller: callerOf(request), appName: app_name, branch: branch ?? "" });
      return {
        app_name: r.appName,
        branch: r.branch,
        services: r.services.map((s) => ({
          name: s.name,
          status: s.status,
          runtime: { replicas_running: s.runtime?.replicasRunning ?? null, hosts_unverified: s.runtime?.hostsUnverified ?? null, reason: orNull(s.runtime?.reason) },
          url: orNull(s.url),
          http_client: orNull(s.httpClient),
          capability_probed_at: s.httpClient ? orNull(s.capabilityProbedAt) : null,
        })),
      };
    },
  );

  const serviceAction = async (request: FastifyRequest, action: string, service: string | null) => {
    const { app_name } = request.params as { app_name: string };
    const { branch } = request.query as { branch?: string };
    return queue.queueAppAction({
      caller: callerOf(request),
      appName: app_name,
      branch: branch ?? "",
      actionType: "SERVICE_ACTION",
      action,
      services: service ? [service] : [],
    });
  };
  const serviceActionResponse = {
    type: "object",
    properties: {
      action_ids: { type: "array", items: { type: "string" } },
      app_name: { type: "string" },
      branch: { type: "string" },
      action: { type: "string" },
      status: { type: "string", enum: ["queued"] },
      services: { type: "array", items: { type: "string" } },
      skipped_static: { type: "array", items: { type: "string" } },
      skipped_not_deployed: {
        type: "array",
        items: { type: "string" },
        description: "Services the saved config declares that the running release does not run (added with save-config): a deploy runs them; an app-level action leaves them out.",
      },
    },
    required: ["action_ids", "app_name", "branch", "action", "status", "services", "skipped_static", "skipped_not_deployed"],
  } as const;
  // A stop holds until a start, or until the branch is deployed again: a deploy swaps to a release
  // only once every service of it passed its checks, so it starts them all.
  const stopHolds = " A stopped service stays stopped until it is started or the branch is deployed again (deploy, redeploy, retry or scale start every service of the release).";
  const rolling =
    " A restart replaces the replicas one at a time, each back and passing its health check before the next goes; the router holds or re-sends the requests meanwhile, so none fails. A replica that does not come back fails the row and leaves the ones after it untouched.";
  const noteOf = { restart: rolling, stop: stopHolds, start: "" } as const;
  const nothingRunning = refusal(
    "`nothing_running`: the branch is not deployed (nothing queued); `service_not_deployed`: the running release does not have the service named (saved with save-config, not deployed yet).",
  );
  for (const action of ["restart", "stop", "start"] as const) {
    app.post(
      `/api/services/:app_name/:service/${action}`,
      {
        config: { access: { scope: "deploy" } },
        schema: {
          tags: ["services"],
          summary: `${action[0]!.toUpperCase()}${action.slice(1)} one service of a branch (a SERVICE_ACTION row).`,
          description: `422 for a static (edge) service, with nothing queued; 404 for an undeclared service; 409 \`nothing_running\` when the branch is not deployed, \`service_not_deployed\` when the running release does not have the service (saved with save-config, not deployed yet).${noteOf[action]}`,
          params: { type: "object", properties: { app_name: { type: "string" }, service: { type: "string" } }, required: ["app_name", "service"] },
          querystring: branchQuery,
          response: { 202: serviceActionResponse, ...authErrors, ...bodyErrors, 409: nothingRunning },
        },
      },
      async (request, reply) => {
        const r = await serviceAction(request, action, (request.params as { service: string }).service);
        return reply.code(202).send({ action_ids: r.actionIds, app_name: r.appName, branch: r.branch, action, status: r.status, services: r.services, skipped_static: r.skippedStatic, skipped_not_deployed: r.skippedNotDeployed });
      },
    );
    app.post(
      `/api/services/:app_name/${action}`,
      {
        config: { access: { scope: "deploy" } },
        schema: {
          tags: ["services"],
          summary: `${action[0]!.toUpperCase()}${action.slice(1)} every container service of a branch (one SERVICE_ACTION row each).`,
          description: `Static services are skipped and listed in \`skipped_static\`, services the running release does not have in \`skipped_not_deployed\`; 422 when every service is static; 409 \`nothing_running\` when the branch is not deployed.${noteOf[action]}`,
          params: appParams,
          querystring: branchQuery,
          response: { 202: serviceActionResponse, ...authErrors, ...bodyErrors, 409: nothingRunning },
        },
      },
      async (request, reply) => {
        const r = await serviceAction(request, action, null);
        return reply.code(202).send({ action_ids: r.actionIds, app_name: r.appName, branch: r.branch, action, status: r.status, services: r.services, skipped_static: r.skippedStatic, skipped_not_deployed: r.skippedNotDeployed });
      },
    );
  }
}

