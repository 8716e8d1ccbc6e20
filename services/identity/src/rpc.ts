/** Connect handlers of identity: thin translations between protobuf and the domain. */
import type { Client, ConnectRouter } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import {
  ApiKeySchema,
  GroupLeaseOutcomeSchema,
  GroupSchema,
  IdentityService,
  PrincipalSchema,
  SessionSchema,
  type ApiKey as ApiKeyMsg,
  type AppsBuildsService,
  type GroupLeaseOutcome,
} from "@platform/proto";
import { inGroup, requireCaller, type Caller } from "@platform/caller";
import type { ServiceContext } from "@platform/service";
import type { Group, Session } from "./entities/index.ts";
import { createGroup, deleteGroup, findVisibleGroup, listGroups, updateGroup } from "./domain/groups.ts";
import { acquireLease, confirmLease, releaseLease, type LeaseOutcome } from "./domain/group-lock.ts";
import { listKeys, mintKey, revokeKey, type KeyView } from "./domain/keys.ts";
import { touchCredentials, verifyCredential } from "./domain/verification.ts";
import { listSessions, revokeSession } from "./domain/sessions-admin.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : "");

const groupMsg = (g: Group) => create(GroupSchema, { slug: g.slug, displayName: g.displayName, createdAt: iso(g.createdAt) });

const keyMsg = ({ key, groupSlug }: KeyView): ApiKeyMsg =>
  create(ApiKeySchema, {
    id: key.id,
    prefix: key.prefix,
    name: key.name,
    scope: key.scope,
    groupSlug,
    kind: key.kind,
    createdAt: iso(key.createdAt),
    lastUsedAt: iso(key.lastUsedAt),
    revokedAt: iso(key.revokedAt),
  });

const sessionMsg = (s: Session, currentId: string) =>
  create(SessionSchema, {
    id: s.id,
    kind: s.kind,
    createdAt: iso(s.createdAt),
    lastUsedAt: iso(s.lastUsedAt),
    idleExpiresAt: iso(s.idleExpiresAt),
    absoluteMaxAt: iso(s.absoluteMaxAt),
    current: s.id === currentId,
  });

function leaseOutcomeMsg(o: LeaseOutcome): GroupLeaseOutcome {
  return create(GroupLeaseOutcomeSchema, {
    outcome: o.outcome,
    lease:
      o.outcome === "granted" || o.outcome === "held"
        ? { ...o.lease, expiresAtMs: BigInt(o.lease.expiresAt.getTime()) }
        : undefined,
    retryAfterS: o.outcome === "busy" ? o.retryAfterS : 0,
    groupSlug: o.outcome === "renamed" ? o.groupSlug : "",
  });
}

export function routes(ctx: ServiceContext, apps: Client<typeof AppsBuildsService>) {
  // How many app branches a group owns under one slug, as apps-builds answers the operator acting in it.
  const appsIn = (caller: Caller) => async (slug: string) => (await apps.listApps({ caller: inGroup(caller, slug) })).total;
  return (router: ConnectRouter) => {
    router.service(IdentityService, {
      readiness: (req) => ctx.readiness(req),

      async verifyCredential(req) {
        const p = await ctx.write((em) => verifyCredential(em, req.credential));
        return {
          principal: create(PrincipalSchema, {
            kind: p.kind,
            id: p.id,
            scope: p.scope,
            keyGroup: p.keyGroup,
            keyKind: p.keyKind,
            user: p.user
              ? {
                  id: p.user.id,
                  email: p.user.email,
                  displayName: p.user.displayName,
                  platformAdmin: p.user.platformAdmin,
                  disabled: p.user.disabled,
                  personalGroup: p.user.personalGroup,
                }
              : undefined,
            memberships: p.memberships,
            sessionKind: p.sessionKind,
            validUntilMs: BigInt(p.validUntilMs),
          }),
        };
      },

      async touchCredentials(req) {
        const touched = await ctx.write((em) =>
          touchCredentials(
            em,
            req.uses.map((u) => ({ kind: u.kind, id: u.id, usedAt: new Date(Number(u.usedAtMs)) })),
          ),
        );
        return { touched };
      },

      async getGroup(req) {
        const caller = requireCaller(req.caller);
        return groupMsg(await ctx.read((em) => findVisibleGroup(em, caller, req.slug)));
      },

      async createGroup(req) {
        const caller = requireCaller(req.caller);
        return groupMsg(await createGroup(ctx.write, caller, { slug: req.slug, displayName: req.displayName }));
      },

      async updateGroup(req) {
        const caller = requireCaller(req.caller);
        return groupMsg(await updateGroup(ctx.write, caller, req.slug, { newSlug: req.newSlug, displayName: req.displayName }));
      },

      async deleteGroup(req) {
        const caller = requireCaller(req.caller);
        await deleteGroup(ctx.write, caller, req.slug, appsIn(caller));
        return {};
      },

      async acquireGroupLease(req) {
        return leaseOutcomeMsg(
          await acquireLease(ctx.write, { groupSlug: req.groupSlug, mode: req.mode, holder: req.holder, ttlMs: req.ttlMs, waitMs: req.waitMs }),
        );
      },

      async confirmGroupLease(req) {
        const lease = req.lease ?? { id: "", groupId: "", groupSlug: "", mode: "" };
        return leaseOutcomeMsg(await ctx.write((em) => confirmLease(em, lease, req.ttlMs)));
      },

      async releaseGroupLease(req) {
        await ctx.write((em) => releaseLease(em, req.leaseId));
        return {};
      },

      async listGroups(req) {
        const caller = requireCaller(req.caller);
        const groups = await ctx.read((em) => listGroups(em, caller));
        return { items: groups.map(groupMsg), total: groups.length };
      },

      async createKey(req) {
        const caller = requireCaller(req.caller);
        const { view, secret } = await ctx.write((em) =>
          mintKey(em, caller, { name: req.name, scope: req.scope, group: req.group, platform: req.platform }),
        );
        return { key: keyMsg(view), secret };
      },

      async listKeys(req) {
        const caller = requireCaller(req.caller);
        const keys = await ctx.read((em) => listKeys(em, caller));
        return { items: keys.map(keyMsg), total: keys.length };
      },

      async revokeKey(req) {
        const caller = requireCaller(req.caller);
        await ctx.write((em) => revokeKey(em, caller, req.id));
        return {};
      },

      async listSessions(req) {
        const caller = requireCaller(req.caller);
        const sessions = await ctx.read((em) => listSessions(em, caller));
        return { items: sessions.map((s) => sessionMsg(s, caller.principalId)), total: sessions.length };
      },

      async revokeSession(req) {
        const caller = requireCaller(req.caller);
        await ctx.write((em) => revokeSession(em, caller, req.id));
        return {};
      },
    });
  };
}
