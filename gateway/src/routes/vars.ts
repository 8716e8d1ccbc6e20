/**
 * Environment variables of app branches (spec doc 2 section 4.6): read, merge, remove one key,
 * copy-preview and copy-from-branch. apps-builds owns the rules; this module publishes them.
 *
 * Variable values must be JSON strings. The gateway's schema validation would coerce a number,
 * a boolean or null into a string (null into ""), so the string fields are checked as sent,
 * before validation, and anything else is a 422.
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Client } from "@connectrpc/connect";
import { PlatformError } from "@platform/errors";
import type { AppsBuildsService, Variables } from "@platform/proto";
import { callerOf } from "../access.ts";
import { authErrors, bodyErrors, commonQuery, refusal } from "../schemas.ts";

const appName = { type: "object", properties: { app_name: { type: "string" } }, required: ["app_name"] } as const;
const keyName = {
  type: "string",
  minLength: 1,
  maxLength: 256,
  description: "Letters, digits and underscores, not starting with a digit (`^[A-Za-z_][A-Za-z0-9_]*$`), at most 256 characters.",
} as const;
const branchField = { type: "string", description: "Branch of the app; defaults to `main`." } as const;
const writeBranchQuery = {
  type: "string",
  description: "The branch, as GET reads it: the same as `branch` in the body, which it may stand in for. Both, naming different branches, is 422; so is an empty one.",
} as const;

/**
 * The branch a write names: in its body (the spec's place) or in `?branch=`, where GET reads it,
 * so a client that writes the way it reads changes the branch it means rather than `main`.
 */
function writeBranch(request: FastifyRequest): string {
  const inQuery = (request.query as { branch?: string }).branch;
  const inBody = (request.body as { branch?: string }).branch;
  if (inQuery !== undefined && inBody !== undefined && inQuery.trim() !== inBody.trim()) {
    throw PlatformError.invalid(`branch is '${inBody}' in the body and '${inQuery}' in the query; name it once.`);
  }
  const named = inBody ?? inQuery;
  if (named === undefined) return "";
  // Sent empty (a script's unset variable, say), it must not fall back to main: main may be production.
  const branch = named.trim();
  if (!branch) throw PlatformError.invalid("branch is empty: name the branch, or leave branch out to write to main.");
  return branch;
}
const keyList = { type: "array", items: { type: "string" } } as const;
const stamp = {
  type: ["string", "null"],
  description: "ISO 8601 with milliseconds; null while the branch has no variables.",
} as const;

const variablesResponse = {
  type: "object",
  description:
    "The variables document of one branch: `variables` maps each name to its value (an empty object when there are none). " +
    "`updated_at` and `updated_by` describe the whole document, not one variable; both are null while the branch has no variables.",
  properties: {
    app_name: { type: "string" },
    environment: { type: "string" },
    branch: { type: "string" },
    variables: { type: "object", additionalProperties: { type: "string" } },
    updated_by: { type: ["string", "null"], description: "`<credential kind>:<id>` of the last writer." },
    updated_at: stamp,
  },
  required: ["app_name", "environment", "branch", "variables", "updated_by", "updated_at"],
} as const;

/** Refuses (422) a string field, or a value of an object field, sent as anything but a string. */
function stringsAsSent(fields: string[], maps: string[] = []) {
  return async (request: FastifyRequest): Promise<void> => {
    const body = request.body;
    if (!body || typeof body !== "object" || Array.isArray(body)) return;
    const b = body as Record<string, unknown>;
    for (const f of fields) {
      if (f in b && typeof b[f] !== "string") throw PlatformError.invalid(`body.${f} must be a string.`);
    }
    for (const m of maps) {
      const map = b[m];
      if (!map || typeof map !== "object" || Array.isArray(map)) continue;
      for (const [k, v] of Object.entries(map)) {
        if (typeof v !== "string") throw PlatformError.invalid(`The value of '${k.slice(0, 64)}' must be a string.`);
      }
    }
  };
}

export function varRoutes(app: FastifyInstance, apps: Client<typeof AppsBuildsService>, env: { environment: string }): void {
  const documentJson = (v: Variables) => ({
    app_name: v.appName,
    environment: env.environment,
    branch: v.branch,
    variables: v.variables,
    updated_by: v.updatedBy ?? null,
    updated_at: v.updatedAt ?? null,
  });

  app.get(
    "/api/vars/:app_name",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["variables"],
        summary: "The environment variables of one app branch (an empty object when none).",
        description:
          "Answers `{app_name, environment, branch, variables: {NAME: value}, updated_by, updated_at}`; `variables` is an empty " +
          "object when the branch has none (and both `updated_*` are then null). `?branch=` defaults to `main`, not to the production branch.",
        params: appName,
        querystring: { type: "object", properties: { ...commonQuery, branch: branchField } },
        response: { 200: variablesResponse, ...authErrors },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { branch } = request.query as { branch?: string };
      return documentJson(await apps.getVariables({ caller: callerOf(request), appName: app_name, branch: branch ?? "" }));
    },
  );

  app.put(
    "/api/vars/:app_name",
    {
      config: { access: { scope: "deploy" } },
      preValidation: stringsAsSent(["branch"], ["variables"]),
      schema: {
        tags: ["variables"],
        summary: "Set variables of one app branch: merged with the existing ones; effective at the next deploy.",
        description:
          "Names not sent are kept. Values are strings of at most 32 KiB (UTF-8) without NUL characters; a branch holds at most " +
          "500 variables, adding up to at most 1 MiB (`NAME=value` each, UTF-8: what a replica's environment can take; past it 422 `variables_too_large`, copies included). `PORT` and names starting with `PLATFORM_` are reserved (422): the platform sets them in every replica's environment itself. " +
          "Every name and value is checked before anything is written (422). Answers the document after the merge; " +
          "a request that changes nothing leaves `updated_at` as it was.",
        params: appName,
        querystring: { type: "object", properties: { ...commonQuery, branch: writeBranchQuery } },
        body: {
          type: "object",
          properties: {
            branch: branchField,
            variables: { type: "object", description: "`{NAME: value}`.", additionalProperties: { type: "string" } },
          },
          required: ["variables"],
        },
        response: { 200: variablesResponse, ...authErrors, ...bodyErrors },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const b = request.body as { variables: Record<string, string> };
      return documentJson(
        await apps.putVariables({ caller: callerOf(request), appName: app_name, branch: writeBranch(request), variables: b.variables }),
      );
    },
  );

  app.delete(
    "/api/vars/:app_name",
    {
      config: { access: { scope: "deploy" } },
      preValidation: stringsAsSent(["branch", "key"]),
      schema: {
        tags: ["variables"],
        summary: "Remove one variable of one app branch; effective at the next deploy.",
        description: "Answers the document after the removal. A name the branch does not have is 404.",
        params: appName,
        querystring: { type: "object", properties: { ...commonQuery, branch: writeBranchQuery } },
        body: {
          type: "object",
          properties: { branch: branchField, key: keyName },
          required: ["key"],
        },
        response: { 200: variablesResponse, ...authErrors, ...bodyErrors },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const b = request.body as { key: string };
      return documentJson(await apps.deleteVariable({ caller: callerOf(request), appName: app_name, branch: writeBranch(request), key: b.key }));
    },
  );

  app.get(
    "/api/vars/:app_name/copy-preview",
    {
      config: { access: { scope: "read" } },
      schema: {
        tags: ["variables"],
        summary: "What copying the variables of branch `from` into `branch` would do; key names only, never values.",
        description:
          "`new`: source names the destination lacks; `identical`: names with the same value on both; `conflict`: names with another " +
          "value on the destination. Send `destination_updated_at` exactly as returned as the copy's `expected_updated_at`. " +
          "The production branch can be copied from, never into (409).",
        params: appName,
        querystring: {
          type: "object",
          properties: {
            ...commonQuery,
            from: { type: "string", minLength: 1, description: "The branch to copy from." },
            branch: { type: "string", description: "The destination branch; defaults to `main`." },
          },
          required: ["from"],
        },
        response: {
          200: {
            type: "object",
            properties: {
              app_name: { type: "string" },
              environment: { type: "string" },
              branch: { type: "string" },
              source_branch: { type: "string" },
              new: keyList,
              identical: keyList,
              conflict: keyList,
              destination_updated_at: stamp,
            },
            required: ["app_name", "environment", "branch", "source_branch", "new", "identical", "conflict", "destination_updated_at"],
          },
          409: refusal("`destination_is_production`: the destination is the production branch."),
          ...authErrors,
          422: refusal("`same_branch`: source and destination are the same branch; or validation failed."),
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const { from, branch } = request.query as { from: string; branch?: string };
      const p = await apps.previewVariablesCopy({ caller: callerOf(request), appName: app_name, branch: branch ?? "", sourceBranch: from });
      return {
        app_name: p.appName,
        environment: env.environment,
        branch: p.branch,
        source_branch: p.sourceBranch,
        new: p.newKeys,
        identical: p.identicalKeys,
        conflict: p.conflictKeys,
        destination_updated_at: p.destinationUpdatedAt ?? null,
      };
    },
  );

  app.post(
    "/api/vars/:app_name/copy-from-branch",
    {
      config: { access: { scope: "deploy" } },
      preValidation: stringsAsSent(["branch", "source_branch", "on_conflict"]),
      schema: {
        tags: ["variables"],
        summary: "Copy variables from another branch of the app; effective at the destination's next deploy.",
        description:
          "`copied`: names the destination lacked; `overwritten`: conflicting names replaced (`on_conflict: overwrite`); `skipped`: " +
          "conflicting names kept (`on_conflict: skip`) and names whose value was already identical. `keys` narrows the copy to " +
          "those names, each of which must be set on the source. Audited as `env_vars_copied` with key names only.",
        params: appName,
        querystring: { type: "object", properties: commonQuery },
        body: {
          type: "object",
          properties: {
            branch: { type: "string", minLength: 1, description: "The destination branch; never the production branch." },
            source_branch: { type: "string", minLength: 1 },
            on_conflict: { type: "string", enum: ["skip", "overwrite"], default: "skip" },
            keys: { type: "array", items: keyName, minItems: 1, description: "Copy only these names (default: every name of the source)." },
            expected_updated_at: {
              type: ["string", "null"],
              description: "The copy-preview's `destination_updated_at`, sent exactly as previewed (null when it was null).",
            },
          },
          required: ["branch", "source_branch", "expected_updated_at"],
        },
        response: {
          200: {
            type: "object",
            properties: {
              copied: keyList,
              overwritten: keyList,
              skipped: keyList,
              destination_updated_at: stamp,
            },
            required: ["copied", "overwritten", "skipped", "destination_updated_at"],
          },
          409: refusal(
            "`destination_changed`: the destination's variables changed since the preview (`destination_updated_at` gives the current " +
              "stamp); or `destination_is_production`: production can be copied from, never into.",
          ),
          ...authErrors,
          422: refusal("`same_branch`, `keys_not_in_source`, or validation failed."),
          ...bodyErrors,
        },
      },
    },
    async (request) => {
      const { app_name } = request.params as { app_name: string };
      const b = request.body as { branch: string; source_branch: string; on_conflict?: string; keys?: string[]; expected_updated_at: string | null };
      const r = await apps.copyVariablesFromBranch({
        caller: callerOf(request),
        appName: app_name,
        branch: b.branch,
        sourceBranch: b.source_branch,
        onConflict: b.on_conflict ?? "skip",
        keys: b.keys ?? [],
        expectedUpdatedAt: b.expected_updated_at ?? undefined,
      });
      return {
        copied: r.copied,
        overwritten: r.overwritten,
        skipped: r.skipped,
        destination_updated_at: r.destinationUpdatedAt ?? null,
      };
    },
  );
}
