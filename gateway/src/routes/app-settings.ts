/**
 * App settings (spec doc 1 section 4.4): PATCH of an app branch, set-production, and the config
 * layers (GET and PUT /api/apps/{app_name}/config).
 *
 * The PATCH and save-config bodies are judged by apps-builds, which receives them exactly as the
 * client sent them: the rules are about raw JSON (null only for seed_from_reference, unknown
 * fields refused, `config_yaml` not a string refused with its own code), and the gateway's schema
 * validation would blur them (it coerces `null` to `""` or `false` and strips unknown properties).
 * So these bodies are kept as sent before validation, and their schemas here document them
 * (`attachValidation`: a schema mismatch is left to the service's refusal, always a 422).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { Client } from "@connectrpc/connect";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import type { AppsBuildsService } from "@platform/proto";
import { callerOf } from "../access.ts";
import { authErrors, bodyErrors, commonQuery, refusal } from "../schemas.ts";
import { appJson } from "./apps.ts";

const appName = { type: "object", properties: { app_name: { type: "string" } }, required: ["app_name"] } as const;
const branchQuery = {
  type: "object",
  properties: { ...commonQuery, branch: { type: "string", description: "Branch of the app; defaults to the production branch." } },
} as const;

/** Bodies as the client sent them, taken before schema validation changes them. */
const sentBodies = new WeakMap<FastifyRequest, unknown>();

async function keepSentBody(request: FastifyRequest, _reply: FastifyReply): Promise<void> {
  if (request.body !== undefined) sentBodies.set(request, structuredClone(request.body));
}

/** The body as sent, for the service to judge; a failed check of another part still answers 422. */
function sentBody(request: FastifyRequest): Value | undefined {
  if (request.validationError && request.validationError.validationContext !== "body") throw request.validationError;
  const body = sentBodies.get(request);
  return body === undefined ? undefined : fromJson(ValueSchema, body as JsonValue);
}

const anyJson = { description: "Any JSON value." } as const;
const jsonObject = { type: "object", additionalProperties: true } as const;
const overlaySchema = {
  type: "object",
  description: "Dashboard edits by config path: `{path: {value, base}}`, `base` being the repository's value when the edit was made (null when it had none).",
  additionalProperties: { type: "object", properties: { value: anyJson, base: anyJson }, required: ["value", "base"] },
} as const;

export function appSettingsRoutes(app: FastifyInstance, apps: Client<typeof AppsBuildsService>): void {
  app.patch(
    "/api/apps/:app_name",
    {
      config: { access: { scope: "deploy" } },
      attachValidation: true,
      preValidation: keepSentBody,
      schema: {
        tags: ["apps"],
        summary: "Partial update of one app branch: only the fields sent change.",
        description:
          "Only `seed_from_reference` accepts null (it clears the reference); any other null, an unknown field or a wrong type is 422 " +
          "`{code, message, errors: [{field, code, message}]}`. A new `config_path` re-queues the preflight (`preflight_action_id` " +
          "is then in the response) and clears the config's base layer, read from the old file, until the preflight reads the new one; " +
          "it is 409 `repository_already_registered` when another app of the group builds the same repository from that file. A `visibility` change is stored at once and, while the branch is deployed, queues a route reconcile " +
          "(a RECONCILE_ROUTING action: a private app loses its public route within seconds, also while a deploy of the branch is in flight, " +
          "whose swap then routes the new visibility). `deploy_config`, `services` and `containers` are stored as sent; a feature " +
          "flag omitted next to a `deploy_config` that has that section (`database: {enabled: true}`) is derived from it.",
        params: appName,
        querystring: branchQuery,
        body: {
          type: "object",
          additionalProperties: false,
          properties: {
            display_name: { type: "string", minLength: 1, maxLength: 200 },
            description: { type: "string", maxLength: 2000 },
            config_path: { type: "string", description: "Relative path of the app config file in the repository; re-queues the preflight." },
            deploy_config: { type: "object", additionalProperties: true },
            services: { type: "array" },
            containers: { type: "array" },
            database_enabled: { type: "boolean" },
            cache_enabled: { type: "boolean" },
            email_enabled: { type: "boolean" },
            seed_from_reference: {
              type: ["string", "null"],
              maxLength: 512,
              description:
                "`<app>:<branch>:<selector>`, consumed on the first deploy; the source must be this app or an app in the same group " +
                "(else 404), and not the patched branch itself (422 `seed_is_this_branch`); null clears it. Refused (409 `app_running`) while the branch runs, (409 `already_seeded`) once its first deploy has happened, and (409 `clone_data_scheduled`) on a branch registered with `clone_data_from_branch`.",
            },
            visibility: { type: "string", enum: ["public", "private"] },
            force_remove_domains: { type: "boolean", description: "Needed to flip private while custom domains are attached; honoured only on the production branch (true on another branch is 409 `force_on_non_owning_branch`)." },
          },
        },
        response: {
          200: { $ref: "App#" },
          409: refusal("`app_running`: a seed reference on a running branch; `already_seeded`: on a branch whose first deploy has happened; `clone_data_scheduled`: on a branch with a data copy scheduled; `force_on_non_owning_branch`: force_remove_domains true on a branch other than production."),
          ...authErrors,
          ...bodyErrors,
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const r = await apps.updateApp({ caller: callerOf(request), appName: app_name, branch: branch ?? "", patch: sentBody(request) });
      return { ...appJson(r.app!, true), ...(r.preflightActionId ? { preflight_action_id: r.preflightActionId } : {}) };
    },
  );

  app.post(
    "/api/apps/:app_name/set-production",
    {
      config: { access: { scope: "deploy" } },
      schema: {
        tags: ["apps"],
        summary: "Promote a branch to production; the previous production branch is demoted in the same transaction.",
        description: "422 `label_too_long` when the demoted branch's host label `<app>-<branch>` would exceed 63 characters.",
        params: appName,
        querystring: {
          type: "object",
          properties: { ...commonQuery, branch: { type: "string", minLength: 1, description: "The branch to promote." } },
          required: ["branch"],
        },
        response: {
          200: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              branch: { type: "string", description: "The production branch now." },
              previous_production_branch: {
                type: ["string", "null"],
                description: "The production branch before the call: the branch itself when it already was production, null when the app had none.",
              },
              changed: { type: "boolean", description: "False when the branch already was production (nothing written)." },
            },
            required: ["app_name", "branch", "previous_production_branch", "changed"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch: string };
      const r = await apps.setProductionBranch({ caller: callerOf(request), appName: app_name, branch });
      return { app_name: r.appName, branch: r.branch, previous_production_branch: r.previousProductionBranch ?? null, changed: r.changed };
    },
  );

  app.get(
    "/api/apps/:app_name/config",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["apps"],
        summary: "The config layers of one app branch: base, overlay, effective, source map and the effective config as YAML.",
        params: appName,
        querystring: branchQuery,
        response: {
          200: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              branch: { type: "string" },
              config_path: { type: "string" },
              base: { ...jsonObject, type: ["object", "null"], description: "The repository's config as last read; null until one is read." },
              overlay: overlaySchema,
              effective: { ...jsonObject, type: ["object", "null"], description: "The base with the overlay written over it; null when there is no config (no base, and no overlay entry that applies without one: settings of a service wait for a layer that declares it)." },
              source_map: {
                type: "object",
                description: "Every leaf path of the effective config: `repository` or `dashboard`.",
                additionalProperties: { type: "string", enum: ["repository", "dashboard"] },
              },
              effective_yaml: { type: ["string", "null"], description: "Null when there is no config or it cannot be rendered (it fails validation)." },
            },
            required: ["app_name", "branch", "config_path", "base", "overlay", "effective", "source_map", "effective_yaml"],
          },
          ...authErrors,
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const r = await apps.getAppConfig({ caller: callerOf(request), appName: app_name, branch: branch ?? "" });
      return {
        app_name: r.appName,
        branch: r.branch,
        config_path: r.configPath,
        base: r.base ?? null,
        overlay: r.overlay ?? {},
        effective: r.effective ?? null,
        source_map: r.sourceMap,
        effective_yaml: r.effectiveYaml ?? null,
      };
    },
  );

  app.put(
    "/api/apps/:app_name/config",
    {
      config: { access: { scope: "deploy" }, tooLargeIs422: true },
      attachValidation: true,
      preValidation: keepSentBody,
      schema: {
        tags: ["apps"],
        summary: "Save the app config from the dashboard: its differences from the repository's config become the overlay.",
        description:
          "Exactly one of `config` (an object) or `config_yaml` (a string). The merged config is validated, a field the " +
          "repository defines may not be omitted (omission never unsets), and the preflight is re-queued. Every refusal is 422 " +
          "`{code, message, errors: [{code, message, path?, line?, column?}]}`: `both_config_fields`, `missing_config`, " +
          "`config_yaml_not_string`, `yaml_syntax`, `not_a_mapping`, `too_large`, `too_deep`, `too_many_nodes`, schema codes, " +
          "`omitted_repository_field`.",
        params: appName,
        querystring: branchQuery,
        body: {
          type: "object",
          properties: {
            config: { type: "object", additionalProperties: true, description: "The whole config as an object." },
            config_yaml: { type: "string", description: "The whole config as YAML text." },
          },
        },
        response: {
          200: {
            type: "object",
            properties: {
              overlay: overlaySchema,
              changed_paths: { type: "array", items: { type: "string" }, description: "Effective leaf paths this save changed." },
              applies_live: { type: "boolean", description: "Every change takes effect without a deploy (cron)." },
              requires_redeploy: { type: "boolean", description: "At least one change needs a redeploy." },
              preflight_action_id: { type: ["string", "null"], description: "The re-queued preflight; null when it could not be queued (the save stands)." },
            },
            required: ["overlay", "changed_paths", "applies_live", "requires_redeploy", "preflight_action_id"],
          },
          ...authErrors,
          ...bodyErrors,
          422: refusal("The body or the config was refused: `detail.errors` lists every problem."),
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      const r = await apps.saveAppConfig({ caller: callerOf(request), appName: app_name, branch: branch ?? "", body: sentBody(request) });
      return {
        overlay: r.overlay ?? {},
        changed_paths: r.changedPaths,
        applies_live: r.appliesLive,
        requires_redeploy: r.requiresRedeploy,
        preflight_action_id: r.preflightActionId ?? null,
      };
    },
  );

}
