/**
 * JSON Schemas shared by routes. The same objects validate requests and generate the OpenAPI
 * document, so the document cannot drift from what the gateway accepts.
 */
import type { RouteOptions } from "fastify";

export const errorSchema = {
  $id: "Error",
  type: "object",
  description: "Every error: `detail` is a sentence, or for refusals a client may branch on, an object with a stable `code` and a `message`.",
  properties: {
    detail: {
      anyOf: [
        { type: "string" },
        {
          type: "object",
          properties: { code: { type: "string" }, message: { type: "string" } },
          required: ["code", "message"],
          additionalProperties: true,
        },
      ],
    },
  },
  required: ["detail"],
} as const;

const errorRef = { $ref: "Error#" } as const;

/** The largest value of a protobuf int32 field. */
export const INT32_MAX = 2_147_483_647;
/** `offset` of every paged list: services count rows in 32 bits, so a larger offset is refused (422), not failed. */
export const offsetParam = { type: "integer", minimum: 0, maximum: INT32_MAX, default: 0 } as const;

/** Error responses every authenticated route may give. */
export const authErrors = {
  401: { ...errorRef, description: "Missing, malformed, unknown or revoked credential: `Invalid or revoked API key`." },
  403: { ...errorRef, description: "Scope too low (`Scope '<required>' required, you have '<actual>'`), operator-only or session-only route." },
  404: { ...errorRef, description: "Unknown resource, another tenant's resource, or a group selector naming a group you are not a member of." },
  422: { ...errorRef, description: "Validation failed." },
} as const;

export const bodyErrors = {
  400: { ...errorRef, description: "Malformed JSON." },
  413: { ...errorRef, description: "Body larger than the gateway accepts." },
  415: { ...errorRef, description: "A body sent as another content type than application/json." },
} as const;

/** An error answer of a route's own, described where the route is. */
export const refusal = (description: string) => ({ ...errorRef, description }) as const;

/** The methods whose body the gateway reads (and so may refuse as too large or not JSON). */
const BODY_METHODS = ["POST", "PUT", "PATCH", "DELETE"];

/**
 * The answers the gateway gives before any route's handler runs, listed on every documented
 * route that does not describe them itself: 400 for a malformed request (a NUL character or a
 * path segment too long in the URL, a body that is not JSON), 431 for a URL or headers too large
 * for Node's parser, 401 where a credential is needed, 503
 * where a service behind it may be unavailable, and 413 and 415 on the methods whose body it
 * reads, whether or not the route takes one.
 */
export function listGatewayAnswers(route: RouteOptions): void {
  const schema = route.schema as { hide?: boolean; response?: Record<string, unknown> } | undefined;
  if (!schema || schema.hide) return;
  const response = (schema.response ??= {});
  response[400] ??= refusal("Malformed request: a NUL character in the URL, a path segment over 1024 characters, or a body that is not JSON.");
  response[431] ??= refusal("The request's URL or headers are too large (together over 16 KiB).");
  if (!(route.config as { access?: { public?: boolean } } | undefined)?.access?.public) {
    response[401] ??= authErrors[401];
    response[503] ??= refusal("A service the route needs is unavailable (restarting, or its database is); nothing was done that the answer does not say. Retry shortly.");
  }
  const methods = Array.isArray(route.method) ? route.method : [route.method];
  if (methods.some((m) => BODY_METHODS.includes(m))) {
    response[413] ??= bodyErrors[413];
    response[415] ??= bodyErrors[415];
  }
}

/**
 * The answers of a route that registers an app (POST /api/apps, and POST /api/builds for an
 * unknown app) beyond its own 409s: the group lock codes (spec doc 1 sections 4.4 and 7).
 */
export function groupLockErrors(own409: string) {
  return {
    404: { ...errorRef, description: `${authErrors[404].description} Also: the group was deleted while the registration waited for its lock (nothing written).` },
    409: {
      ...errorRef,
      description:
        `${own409}; or a group lock code: \`group_busy\` (\`retry_after\`: seconds to wait; the group is being renamed or deleted), ` +
        "`group_renamed_during_registration` (`group_slug`: the group's current slug; nothing written) or " +
        "`group_deleted_during_registration` (nothing written).",
    },
  } as const;
}

/** Query parameters accepted on every route: group selection and the legacy environment. */
export const commonQuery = {
  group: {
    type: "string",
    description: "Group to act in: first in the selection order, then the X-Platform-Group header, then the key's own group; a group you are not a member of gives 404.",
  },
  environment: {
    type: ["string", "array"],
    items: { type: "string" },
    description: "Legacy parameter: accepted and ignored, however often given; the API is bound to one environment.",
  },
} as const;

export const groupSchema = {
  $id: "Group",
  type: "object",
  properties: {
    slug: { type: "string" },
    display_name: { type: "string" },
    created_at: { type: "string", format: "date-time" },
  },
  required: ["slug", "display_name", "created_at"],
} as const;

export const apiKeySchema = {
  $id: "ApiKey",
  type: "object",
  description: "An API key as listed: never the key itself nor its hash.",
  properties: {
    id: { type: "string", format: "uuid" },
    prefix: { type: "string", description: "First characters of the key, to recognise it." },
    name: { type: "string" },
    scope: { type: "string", enum: ["read", "deploy", "admin"] },
    group_slug: { type: ["string", "null"], description: "Null for platform keys and the root key." },
    kind: { type: "string", enum: ["group", "platform", "root"] },
    created_at: { type: "string", format: "date-time" },
    last_used_at: { type: ["string", "null"], format: "date-time" },
    revoked_at: { type: ["string", "null"], format: "date-time" },
  },
  required: ["id", "prefix", "name", "scope", "group_slug", "kind", "created_at", "last_used_at", "revoked_at"],
} as const;

const nullableString = { type: ["string", "null"] } as const;

export const appSchema = {
  $id: "App",
  type: "object",
  description: "An app on one branch (doc 1 section 2.1). The single-app response adds the last_* fields.",
  properties: {
    id: { type: "string", format: "uuid" },
    app_name: { type: "string" },
    display_name: { type: "string" },
    slug: { type: "string" },
    group_slug: { type: "string" },
    branch: { type: "string" },
    repository: { type: "string", description: "As registered, but for credentials: an https URL's user part (a token, or user and password) reads `***`, an ssh URL's password too." },
    config_path: { type: "string" },
    description: { type: "string" },
    deploy_status: { type: "string", description: "undeployed until the first deploy; then running, deploying, failed, undeploying, undeploy_failed. A deploy that ended before an agent claimed it (its build failed or was cancelled) leaves it as it was; last_deploy_status and last_deploy_error tell of it." },
    visibility: { type: "string", enum: ["public", "private"] },
    is_production: { type: "boolean" },
    latest_build: {
      ...nullableString,
      description: "Tag of the branch's latest successful build: the image a redeploy without a build ships. A build still running or failed is not it (see build_count and last_build_status).",
    },
    build_count: { type: "integer" },
    running_version: { ...nullableString, description: "The image tag serving now: a deploy's from its swap commit (its route moved), while the old colour still drains. Null when undeployed." },
    running_build_id: { ...nullableString, description: "The build whose deploy (queued with it: auto_deploy, or a redeploy with rebuild) put the running release in place. Null after a no-build deploy (POST /api/deployments of a tag, a redeploy of the image, a scale) or a retry: not reported, never a guess." },
    running_since: { ...nullableString, description: "When the serving release started serving: its deploy's swap commit (its completion for a deploy that moved no route)." },
    urls: {
      type: "array",
      items: { type: "string" },
      description:
        "Live front doors: the primary routed services of the release serving now, the one mounted at / first (empty while nothing serves, or for a private app).",
    },
    services: {
      type: "array",
      description:
        "The app's services in the order the config declares them (its config's, and any the serving release still runs), each with its address as routed now: " +
        "a mount saved with save-config shows once a deploy routes it; null for an unrouted service or while nothing serves. A path-mounted service " +
        "receives the request's whole path, its mount included (`/api/x` reaches the service mounted at `/api` as `/api/x`).",
      items: { type: "object", properties: { name: { type: "string" }, url: nullableString } },
    },
    database_enabled: { type: "boolean" },
    cache_enabled: { type: "boolean" },
    email_enabled: { type: "boolean" },
    preflight_status: {
      type: "string",
      enum: ["pending", "no_access", "needs_config", "config_invalid", "ready", "exempt"],
      description: "Only ready and exempt unlock build, deploy and retry. exempt is set and lifted by a platform operator (POST .../preflight/recheck with `exempt`).",
    },
    preflight_result: {
      type: ["object", "null"],
      properties: {
        reason: { type: "string" },
        detail: { type: "string" },
        services: { type: "array", items: { type: "string" } },
        missing_paths: { type: "array", items: { type: "string" } },
        errors: { type: "array", items: { type: "object", additionalProperties: true } },
      },
    },
    deploy_warning: nullableString,
    warnings: {
      type: "array",
      items: { type: "string" },
      description:
        "Non-fatal messages: a visibility change waiting for a deploy, and a service of the serving release that keeps crashing " +
        "(`Service <name> keeps crashing: ...`, from its third crash in a row with no run of a minute between, until a restart runs a minute or another release serves).",
    },
    created_by: { type: "string" },
    created_at: { type: "string" },
    updated_at: { type: "string" },
    last_deploy_status: {
      ...nullableString,
      description: "Status of the latest deployment of the branch (a DEPLOY, RETRY or UNDEPLOY, as GET /api/deployments lists them): after an undeploy, the undeploy's. The deploy before it stays in the deployments and their history.",
    },
    last_deploy_error: { ...nullableString, description: "Error of that latest deployment; null unless it failed or was cancelled with a reason." },
    last_crash_output: {
      type: ["object", "null"],
      additionalProperties: { type: "array", items: { type: "string" } },
      description: "Per service, the last 30 lines a release that crashed during its health checks wrote, while that failed deploy is the latest deployment; null otherwise.",
    },
    last_build_status: nullableString,
    last_build_error: nullableString,
    preflight_action_id: { type: "string", description: "Registration only: the preflight queued for the new app, a GIT_PREFLIGHT action (GET /api/deployments/queue/{action_id})." },
    copied_var_keys: { type: "array", items: { type: "string" }, description: "Registration with copy_vars_from_branch: the copied names." },
    clone_data_scheduled: {
      type: "object",
      description: "Registration with clone_data_from_branch.",
      properties: {
        source_branch: { type: "string" },
        components: { type: "object", properties: { db: { type: "boolean" }, drives: { type: "boolean" }, buckets: { type: "boolean" } } },
      },
    },
  },
  required: ["id", "app_name", "group_slug", "branch", "repository", "deploy_status", "preflight_status", "urls"],
} as const;

export const sharedSchemas = [errorSchema, groupSchema, apiKeySchema, appSchema];

interface DocumentOperation {
  operationId?: string;
  requestBody?: { required?: boolean; content?: Record<string, { schema?: { type?: unknown } }> };
}

/**
 * What @fastify/swagger leaves out of the OpenAPI document: a body a route takes optionally (its
 * schema allows null, so no body at all is accepted) is not `required`, and every operation has
 * an operationId, from its method and path (`postAppsByAppNameRedeploy`), which client generators
 * name their functions by.
 */
export function finishDocument<T extends { paths?: Record<string, Record<string, unknown> | undefined> }>(document: T): T {
  const word = (s: string) => s.replace(/(^|[-_.])([a-z0-9])/g, (_m, _sep: string, c: string) => c.toUpperCase());
  for (const [path, item] of Object.entries(document.paths ?? {})) {
    for (const [method, value] of Object.entries(item ?? {})) {
      const op = value as DocumentOperation;
      if (typeof op !== "object" || op === null || !("responses" in op)) continue;
      const schemaType = op.requestBody?.content?.["application/json"]?.schema?.type;
      if (op.requestBody && Array.isArray(schemaType) && schemaType.includes("null")) op.requestBody.required = false;
      op.operationId ??=
        method +
        path
          .replace(/^\/api/, "")
          .split("/")
          .filter(Boolean)
          .map((segment) => (segment.startsWith("{") ? `By${word(segment.slice(1, -1))}` : word(segment)))
          .join("");
    }
  }
  return document;
}
