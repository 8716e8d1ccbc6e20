/**
 * GET /api/logs (spec doc 1 section 4.6), answered by health-aggregator's log store. `branch`
 * only scopes the access check: the caller must see the app on that branch, which apps-builds,
 * the owner of apps and their branches, says; no line is filtered by it.
 */
import type { FastifyInstance } from "fastify";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import type { AppsBuildsService, Caller, DeployQueueService, HealthAggregatorService, LogRow, QueryLogsResponse } from "@platform/proto";
import { checkIdPrefix } from "@platform/errors";
import { platformErrorOf } from "@platform/rpc";
import { callerOf } from "../access.ts";
import { authErrors, commonQuery, offsetParam } from "../schemas.ts";

const SOURCES = ["agent", "deploy", "build", "container", "backup"] as const;
const LEVELS = ["info", "warning", "error"] as const;
const CONTAINER_REASONS = ["no_log_group", "no_output_yet"] as const;
const nullableString = { type: ["string", "null"] } as const;
const idParam = (what: string) =>
  ({
    type: "string",
    description:
      `The id, or a prefix of at least 8 hex-or-hyphen characters (shorter is 422) naming one ${what}. Identifies the owning app: app_name and branch are then ignored. ` +
      "An id you cannot see gives an empty result, like an unknown one.",
  }) as const;

const logRowSchema = {
  type: "object",
  description: "A log line (doc 1 section 2.6).",
  properties: {
    id: { type: "integer" },
    timestamp: { type: "string", format: "date-time" },
    source: { type: "string", enum: SOURCES },
    level: { type: "string", enum: LEVELS },
    app_name: nullableString,
    service_name: nullableString,
    deployment_id: { ...nullableString, description: "The deployment a line is about; on a container line, the deployment that started the replica." },
    build_id: nullableString,
    action_id: nullableString,
    instance_id: nullableString,
    message: { type: "string" },
    metadata: { type: "object", additionalProperties: true },
  },
  required: ["id", "timestamp", "source", "level", "app_name", "service_name", "deployment_id", "build_id", "action_id", "instance_id", "message", "metadata"],
} as const;

const orNull = (v: string | undefined) => v ?? null;

function rowJson(r: LogRow) {
  return {
    id: Number(r.id),
    timestamp: r.timestamp,
    source: r.source,
    level: r.level,
    app_name: orNull(r.appName),
    service_name: orNull(r.serviceName),
    deployment_id: orNull(r.deploymentId),
    build_id: orNull(r.buildId),
    action_id: orNull(r.actionId),
    instance_id: orNull(r.instanceId),
    message: r.message,
    metadata: r.metadataJson ? (JSON.parse(r.metadataJson) as Record<string, unknown>) : {},
  };
}

interface LogsQuery {
  app_name?: string;
  source?: string;
  service_name?: string;
  deployment_id?: string;
  build_id?: string;
  action_id?: string;
  level?: string;
  search?: string;
  since?: string;
  limit: number;
  offset: number;
  branch?: string;
}

/**
 * The log service not answering (down, or past its deadline) is the log store being unreachable to
 * the caller: the spec's 200 with empty logs and an `error` text, as when the service cannot read
 * its own store. Any other refusal (a bad parameter: 422) stands.
 */
function logStoreUnreachable(err: unknown): Pick<QueryLogsResponse, "logs" | "total" | "hasMore" | "error" | "reason"> {
  if (!(err instanceof ConnectError) || (err.code !== Code.Unavailable && err.code !== Code.DeadlineExceeded)) throw err;
  const why = err.code === Code.DeadlineExceeded ? "did not answer in time" : "is unavailable";
  return { logs: [], total: 0, hasMore: false, error: `The log store ${why}; try again in a moment.`, reason: undefined };
}

/** Whether the caller sees the app on the branch; an app it cannot see there reads as an unknown one. */
async function seesAppOn(apps: Client<typeof AppsBuildsService>, caller: Caller, appName: string, branch: string): Promise<boolean> {
  try {
    await apps.getApp({ caller, appName, branch });
    return true;
  } catch (err) {
    if (platformErrorOf(err)?.status === 404) return false;
    throw err;
  }
}

const FULL_ID_LENGTH = 36;

/**
 * The whole id a prefix names (spec doc 1 section 4.5: id lookups take 8 or more hex-or-hyphen
 * characters), as its owner resolves it for this caller; what names nothing it can see stays as
 * given and so matches no line, as an unknown whole id does.
 */
async function wholeId(given: string | undefined, what: string, resolve: (prefix: string) => Promise<string>): Promise<string> {
  const id = given?.trim() ?? "";
  if (!id) return "";
  const prefix = checkIdPrefix(id, what);
  if (prefix.length === FULL_ID_LENGTH) return prefix;
  return resolve(prefix).catch((err: unknown) => {
    if (platformErrorOf(err)?.status === 404) return prefix;
    throw err;
  });
}

export function logRoutes(
  app: FastifyInstance,
  { health, apps, queue }: { health: Client<typeof HealthAggregatorService>; apps: Client<typeof AppsBuildsService>; queue: Client<typeof DeployQueueService> },
): void {
  app.get(
    "/api/logs",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["logs"],
        summary: "Log lines, newest first. Plain polling: a follow client asks again with a narrower since.",
        description:
          "Without app_name a tenant reads its group's lines; operators read every group's unless they select one. " +
          "Source semantics: `agent` and `backup` match that source exactly; `deploy` matches deploy lines and agent lines " +
          "that carry a deployment_id; `build` reads the shipped lines of the 5 most recent builds with lines in the window (or of the build an id names); " +
          "`container` reads the replicas' stdout (level info) and stderr (level warning) as the log collector shipped them, which includes the output a crashed replica left " +
          "(the crash tail of a failed deploy is that same output, so it is not repeated). A replica, and a build's commands, ship at most 6 000 lines at once, then 100 a second, by default (the agent's " +
          "AGENT_LOG_LINES_PER_MINUTE); past it lines are dropped and a warning line in the same log says how many (a build's own log keeps its first and last output). With a deployment_id it reads the output of the replicas " +
          "that deployment started; a build_id or action_id (which container lines do not carry) selects the owning app's output. " +
          "An empty container answer carries `reason`. " +
          "`total` is exact up to 10 000 (or offset + limit when larger); past that it reports that bound plus one, and has_more stays exact. " +
          "When the log store is unreachable the answer is still 200: empty logs and an `error` text.",
        querystring: {
          type: "object",
          properties: {
            ...commonQuery,
            app_name: { type: "string", description: "Slug or canonical name. Omitted: every app you may read." },
            source: { type: "string", enum: SOURCES },
            service_name: { type: "string" },
            deployment_id: idParam("deployment"),
            build_id: idParam("build"),
            action_id: idParam("queue action"),
            level: { type: "string", enum: LEVELS },
            search: {
              type: "string",
              description:
                "Full-text search over message: every word must appear, in any case and order. Spaces and punctuation separate words, " +
                "so `healthz` finds `GET /healthz` and `build info` finds `dist/build-info.txt`; a part of a word finds nothing. At most 500 characters (422).",
            },
            since: {
              type: "string",
              default: "1h",
              description:
                "Relative window: 30s, 30m, 1h, 24h, 7d, 2w (a number of at most 9 digits and a unit). A longer window than 365d is read as 365d. Lines are kept LOG_RETENTION_DAYS " +
                "(30 by default): a wider window finds nothing older. A build's own log stays on the build (GET /api/builds/id/{build_id}/logs).",
            },
            limit: { type: "integer", minimum: 1, maximum: 1000, default: 100 },
            offset: offsetParam,
            branch: { type: "string", description: "Only scopes the access check of app_name: the caller must see the app on this branch (one the app has), else the answer is empty as for an unknown app. Lines are not filtered by it." },
          },
        },
        response: {
          200: {
            type: "object",
            properties: {
              logs: { type: "array", items: logRowSchema },
              total: { type: "integer" },
              has_more: { type: "boolean" },
              error: { type: "string", description: "Present, with empty logs, when the log store is unreachable." },
              reason: {
                type: "string",
                enum: CONTAINER_REASONS,
                description:
                  "Present only when source is container and nothing matched (total 0, no error): `no_log_group` when no container output " +
                  "was ever stored for that app, service_name and branch (nothing deployed there); `no_output_yet` when there was, but none " +
                  "in the window and filters.",
              },
            },
            required: ["logs", "total", "has_more"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const q = request.query as LogsQuery;
      const caller = callerOf(request);
      const [deploymentId, buildId, actionId] = await Promise.all([
        wholeId(q.deployment_id, "a deployment id", async (p) => (await queue.getAction({ caller, actionId: p })).actionId),
        wholeId(q.build_id, "a build id", async (p) => (await apps.getBuild({ caller, buildId: p })).id),
        wholeId(q.action_id, "an action id", async (p) => (await queue.getAction({ caller, actionId: p })).actionId),
      ]);
      // An id names its app, and then app_name and branch are ignored.
      const branch = q.app_name && q.branch?.trim() && !q.deployment_id && !q.build_id && !q.action_id ? q.branch.trim() : null;
      // Asked together: the log store checks every parameter (422) whatever the access check says.
      const [r, visible] = await Promise.all([
        health
          .queryLogs({
            caller,
            appName: q.app_name ?? "",
            source: q.source ?? "",
            serviceName: q.service_name ?? "",
            deploymentId,
            buildId,
            actionId,
            level: q.level ?? "",
            search: q.search ?? "",
            since: q.since ?? "",
            limit: q.limit,
            offset: q.offset,
            branch: q.branch ?? "",
          })
          .catch(logStoreUnreachable),
        branch ? seesAppOn(apps, caller, q.app_name!, branch) : true,
      ]);
      if (!visible) return { logs: [], total: 0, has_more: false, ...(q.source === "container" ? { reason: "no_log_group" } : {}) };
      const body: { logs: ReturnType<typeof rowJson>[]; total: number; has_more: boolean; error?: string; reason?: string } = {
        logs: r.logs.map(rowJson),
        total: r.total,
        has_more: r.hasMore,
      };
      if (r.error !== undefined) body.error = r.error;
      if (r.reason !== undefined) body.reason = r.reason;
      return body;
    },
  );
}
