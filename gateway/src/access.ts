/**
 * Who may call a route: every route declares its access in `config.access`, and an onRequest
 * hook attached to the route enforces it before the body is even read (401, then 403, then group
 * selection's 404).
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import { create } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { PlatformError, INVALID_CREDENTIAL, scopeRequired } from "@platform/errors";
import { hasScope, makeCaller, type Caller, type Scope } from "@platform/caller";
import { CredentialUseSchema, type IdentityService, type Principal } from "@platform/proto";
import type { Logger } from "@platform/logger";
import { CredentialCache } from "./domain/credential-cache.ts";
import { credentialDigest, readCredential } from "./domain/credentials.ts";
import { isPlatformOperator, isPlatformRoot, scopeIn, selectGroup, visibleGroups } from "./domain/group-selection.ts";

export interface Access {
  /** No credential needed (health, docs). */
  public?: boolean;
  /** Minimum scope in the selected group. */
  scope?: Scope;
  /** Platform operators only: root key, legacy platform key, platform-admin session. */
  operator?: boolean;
  /** Sessions only; API keys get 403. */
  session?: boolean;
}

declare module "fastify" {
  interface FastifyContextConfig {
    access?: Access;
  }
  interface FastifyRequest {
    caller: Caller | null;
    principal: Principal | null;
  }
}

export interface AccessOptions {
  identity: Client<typeof IdentityService>;
  cache: CredentialCache;
  logger: Logger;
  /** How often cached uses are reported to identity (last_used_at, session idle window). */
  touchIntervalMs?: number;
}

export interface AccessControl {
  /** Verifies a credential, from the cache when possible. */
  authenticate(raw: string): Promise<Principal>;
  flushUses(): Promise<void>;
  /** A group renamed or deleted: nothing cached may keep answering for its old slug. */
  forgetGroup(slug: string): void;
  close(): Promise<void>;
}

export function registerAccess(app: FastifyInstance, opts: AccessOptions): AccessControl {
  const { identity, cache } = opts;
  const pendingUses = new Map<string, { kind: string; id: string; usedAtMs: number }>();
  const knownGroups = new Map<string, number>();
  const defaultCallers = new WeakMap<Principal, Caller>();

  const authenticate = async (raw: string): Promise<Principal> => {
    const digest = credentialDigest(raw);
    const cached = cache.get(digest);
    if (cached) {
      pendingUses.set(`${cached.kind}:${cached.id}`, { kind: cached.kind, id: cached.id, usedAtMs: Date.now() });
      return cached;
    }
    const { principal } = await identity.verifyCredential({ credential: raw });
    if (!principal) throw PlatformError.unauthenticated();
    cache.set(digest, principal);
    return principal;
  };

  const flushUses = async (): Promise<void> => {
    if (pendingUses.size === 0) return;
    const uses = [...pendingUses.values()].map((u) => create(CredentialUseSchema, { ...u, usedAtMs: BigInt(u.usedAtMs) }));
    pendingUses.clear();
    await identity.touchCredentials({ uses }).catch((err: unknown) => opts.logger.warn({ err }, "could not record credential uses"));
  };
  const timer = setInterval(() => void flushUses(), opts.touchIntervalMs ?? 1000);
  timer.unref();

  /** Operators may name any existing group; the answer is cached like credentials. */
  const operatorGroupExists = async (caller: Caller, slug: string): Promise<void> => {
    const until = knownGroups.get(slug);
    if (until && until > Date.now()) return;
    await identity.getGroup({ caller, slug });
    knownGroups.set(slug, Date.now() + 30_000);
  };

  app.decorateRequest("caller", null);
  app.decorateRequest("principal", null);

  const check = async (request: FastifyRequest, access: Access): Promise<void> => {
    const raw = readCredential(request.headers.authorization);
    if (!raw) throw PlatformError.unauthenticated(INVALID_CREDENTIAL);
    const principal = await authenticate(raw);
    const operator = isPlatformOperator(principal);
    if (access.operator && !operator) throw PlatformError.forbidden("Platform operator required");
    if (access.session && principal.kind !== "session") throw PlatformError.forbidden("This route requires a session; API keys are refused.");

    const query = request.query as Record<string, unknown> | undefined;
    const header = request.headers["x-platform-group"];
    const selection = selectGroup(
      principal,
      typeof query?.group === "string" ? query.group : undefined,
      typeof header === "string" ? header : undefined,
    );
    const visible = visibleGroups(principal);
    const explicit = selection.source === "query" || selection.source === "header";
    // Without a selector the caller depends on the principal alone: build it once per cached principal.
    let caller = explicit ? undefined : defaultCallers.get(principal);
    if (!caller) {
      caller = makeCaller({
        kind: principal.kind,
        principalId: principal.id,
        userId: principal.user?.id ?? "",
        visibleGroups: visible,
        selectedGroup: selection.slug,
        platformOperator: operator,
        platformRoot: isPlatformRoot(principal),
        scope: scopeIn(principal, selection.slug),
        explicitGroup: explicit,
      });
      if (!explicit) defaultCallers.set(principal, caller);
    }
    if (explicit) {
      if (operator) await operatorGroupExists(caller, selection.slug);
      else if (!visible.includes(selection.slug)) throw PlatformError.notFound(`Group '${selection.slug}' not found`);
    }
    if (access.scope && !hasScope(caller.scope, access.scope)) throw scopeRequired(access.scope, caller.scope || "none");

    request.principal = principal;
    request.caller = caller;
  };

  // The check is attached to each route that needs it, so public routes (health, docs) pay nothing.
  app.addHook("onRoute", (route) => {
    const access: Access = route.config?.access ?? { scope: "read" };
    if (access.public) return;
    const own = route.onRequest ? (Array.isArray(route.onRequest) ? route.onRequest : [route.onRequest]) : [];
    route.onRequest = [(request: FastifyRequest) => check(request, access), ...own];
  });

  return {
    authenticate,
    flushUses,
    forgetGroup(slug) {
      cache.invalidateGroup(slug);
      knownGroups.delete(slug);
    },
    async close() {
      clearInterval(timer);
      await flushUses();
    },
  };
}

/** The caller of an authenticated route; the access hook guarantees it is set. */
export function callerOf(request: FastifyRequest): Caller {
  if (!request.caller) throw PlatformError.unauthenticated();
  return request.caller;
}

/**
 * A route that writes in a group its body names (POST /api/apps `group_slug`) needs `required` in
 * that group as well as in the one it acts in: a session's role differs from group to group. A
 * group the caller does not belong to is left to the service, which refuses it in its own words.
 */
export function requireScopeInNamedGroup(request: FastifyRequest, slug: string, required: Scope): void {
  const caller = callerOf(request);
  const group = slug.trim();
  if (!group || group === caller.selectedGroup || caller.platformOperator || !caller.visibleGroups.includes(group)) return;
  const actual = request.principal ? scopeIn(request.principal, group) : "";
  if (!hasScope(actual, required)) throw scopeRequired(required, actual || "none");
}
