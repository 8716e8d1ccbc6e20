/**
 * The auth context every request carries (spec doc 1 section 5): scopes and their hierarchy,
 * membership roles, and the tenancy test services apply to a `Caller`.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { CallerSchema, type Caller } from "@platform/proto";
import { PlatformError, scopeRequired } from "@platform/errors";

export type { Caller };

export const SCOPES = ["read", "deploy", "admin"] as const;
export type Scope = (typeof SCOPES)[number];

export function isScope(value: string): value is Scope {
  return (SCOPES as readonly string[]).includes(value);
}

/** read = 1 < deploy = 2 < admin = 3; 0 for anything else. */
export function scopeLevel(scope: string): number {
  return (SCOPES as readonly string[]).indexOf(scope) + 1;
}

export function hasScope(actual: string, required: Scope): boolean {
  return scopeLevel(actual) >= scopeLevel(required);
}

/** Throws the spec's 403 when `actual` is below `required`. */
export function requireScope(actual: string, required: Scope): void {
  if (!hasScope(actual, required)) throw scopeRequired(required, actual || "none");
}

export const ROLES = ["owner", "admin", "deployer", "viewer"] as const;
export type Role = (typeof ROLES)[number];

/** A session's scope in a group follows the member's role there. */
export function roleScope(role: string): Scope | "" {
  switch (role) {
    case "owner":
    case "admin":
      return "admin";
    case "deployer":
      return "deploy";
    case "viewer":
      return "read";
    default:
      return "";
  }
}

export function makeCaller(init: MessageInitShape<typeof CallerSchema>): Caller {
  return create(CallerSchema, init);
}

/** Every tenant-facing RPC needs a caller; a request without one is a bug in the gateway. */
export function requireCaller(caller: Caller | undefined): Caller {
  if (!caller || !caller.kind) throw PlatformError.unauthenticated();
  return caller;
}

/**
 * A platform operator who named no group (no `?group=`, no group header) sees every group's
 * records in listings and look-ups; anyone else sees the group they act in.
 */
export function spansEveryGroup(caller: Caller): boolean {
  return caller.platformOperator && !caller.explicitGroup;
}

/**
 * The caller acting in one group, as if it had named it (`?group=`): for the look-ups a service
 * makes once it knows the group of what the request is about (the app's own), so that an
 * operator's look-up stays in that group instead of spanning every group.
 */
export function inGroup(caller: Caller, groupSlug: string): Caller {
  return create(CallerSchema, { ...caller, selectedGroup: groupSlug, explicitGroup: true });
}

/** Who did it, as records name the author (`created_by`, audit logs): `api_key:<id>`, `session:<id>`, or `system`. */
export function actorOf(caller: Caller | null): string {
  if (!caller) return "system";
  return `${caller.kind}:${caller.principalId}`;
}

/** Operators see every group; others only those they belong to. */
export function canSeeGroup(caller: Caller, slug: string): boolean {
  return caller.platformOperator || caller.visibleGroups.includes(slug);
}

export function requireOperator(caller: Caller): void {
  if (!caller.platformOperator) throw PlatformError.forbidden("Platform operator required.");
}
