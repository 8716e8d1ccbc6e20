/**
 * Which group a request acts in (spec doc 1 section 5), in the spec's order: `?group=`, the
 * `X-Platform-Group` header, the group an API key is bound to, the caller's personal group.
 * Who may select what, and the scope that follows, is decided here too.
 */
import { roleScope, type Scope } from "@platform/caller";
import type { Principal } from "@platform/proto";

export type SelectionSource = "query" | "header" | "key" | "personal" | "none";

export interface GroupSelection {
  slug: string;
  source: SelectionSource;
}

export function selectGroup(principal: Principal, queryGroup: string | undefined, headerGroup: string | undefined): GroupSelection {
  const q = queryGroup?.trim();
  if (q) return { slug: q, source: "query" };
  const h = headerGroup?.trim();
  if (h) return { slug: h, source: "header" };
  if (principal.keyGroup) return { slug: principal.keyGroup, source: "key" };
  const personal = principal.user?.personalGroup;
  if (personal) return { slug: personal, source: "personal" };
  return { slug: "", source: "none" };
}

/** Root key, legacy platform key, or a platform-admin session. A group owner is not one. */
export function isPlatformOperator(principal: Principal): boolean {
  if (principal.kind === "api_key") return principal.keyKind === "root" || principal.keyKind === "platform";
  return Boolean(principal.user?.platformAdmin);
}

/** Platform-root: the environment's root key or a platform-admin account (not a legacy key). */
export function isPlatformRoot(principal: Principal): boolean {
  if (principal.kind === "api_key") return principal.keyKind === "root";
  return Boolean(principal.user?.platformAdmin);
}

/** Groups a caller belongs to; operators see every group besides. */
export function visibleGroups(principal: Principal): string[] {
  if (principal.kind === "api_key") return principal.keyGroup ? [principal.keyGroup] : [];
  return principal.memberships.map((m) => m.groupSlug);
}

/** The caller's scope while acting in `slug`. */
export function scopeIn(principal: Principal, slug: string): Scope | "" {
  if (principal.kind === "api_key") return principal.scope as Scope;
  if (principal.user?.platformAdmin) return "admin";
  const membership = principal.memberships.find((m) => m.groupSlug === slug);
  return membership ? roleScope(membership.role) : "";
}
