/**
 * JSON Schemas shared by routes. The same objects validate requests and generate the OpenAPI
 * document, so the document cannot drift from what the gateway accepts.
 */
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
} as const;

/** Query parameters accepted on every route: group selection and the legacy environment. */
export const commonQuery = {
  group: { type: "string", description: "Group to act in (first in the selection order; a group you are not a member of gives 404)." },
  environment: { type: "string", description: "Legacy parameter: accepted and ignored; the API is bound to one environment." },
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

export const sharedSchemas = [errorSchema, groupSchema, apiKeySchema];
