import { defineEntity, p } from "@mikro-orm/core";
import { AuditEntrySchema } from "@platform/db";

export const UserSchema = defineEntity({
  name: "User",
  tableName: "users",
  properties: {
    id: p.uuid().primary(),
    email: p.text().unique(),
    displayName: p.text(),
    platformAdmin: p.boolean().default(false),
    disabled: p.boolean().default(false),
    emailVerified: p.boolean().default(false),
    personalGroupId: p.uuid().nullable(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
export class User extends UserSchema.class {}
UserSchema.setClass(User);

export const GroupSchema = defineEntity({
  name: "Group",
  tableName: "groups",
  properties: {
    id: p.uuid().primary(),
    slug: p.text().unique(),
    displayName: p.text(),
    personal: p.boolean().default(false),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
export class Group extends GroupSchema.class {}
GroupSchema.setClass(Group);

/**
 * A lease on a group (the group lock): shared or exclusive, until `expiresAt`. An exclusive
 * request that has to wait is recorded ungranted (`grantedAt` null) so that shared requests
 * arriving after it queue behind it.
 */
export const GroupLeaseSchema = defineEntity({
  name: "GroupLease",
  tableName: "group_leases",
  properties: {
    id: p.uuid().primary(),
    groupId: p.uuid(),
    mode: p.text(),
    holder: p.text(),
    requestedAt: p.datetime(),
    grantedAt: p.datetime().nullable(),
    expiresAt: p.datetime(),
  },
});
export class GroupLease extends GroupLeaseSchema.class {}
GroupLeaseSchema.setClass(GroupLease);

/** A slug a group was renamed away from: reserved to that group. */
export const FormerGroupSlugSchema = defineEntity({
  name: "FormerGroupSlug",
  tableName: "former_group_slugs",
  properties: {
    slug: p.text().primary(),
    groupId: p.uuid(),
    retiredAt: p.datetime().defaultRaw("now()"),
  },
});
export class FormerGroupSlug extends FormerGroupSlugSchema.class {}
FormerGroupSlugSchema.setClass(FormerGroupSlug);

export const MembershipSchema = defineEntity({
  name: "Membership",
  tableName: "memberships",
  properties: {
    userId: p.uuid().primary(),
    groupId: p.uuid().primary(),
    role: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
  },
});
export class Membership extends MembershipSchema.class {}
MembershipSchema.setClass(Membership);

export const ApiKeySchema = defineEntity({
  name: "ApiKey",
  tableName: "api_keys",
  properties: {
    id: p.uuid().primary(),
    /** The first characters of the key, shown in listings; never enough to use it. */
    prefix: p.text(),
    /** SHA-256 of the raw key, hex. The raw key is never stored. */
    hash: p.text().unique(),
    name: p.text(),
    scope: p.text(),
    /** group, platform (legacy platform key) or root (the environment's root key). */
    kind: p.text(),
    groupId: p.uuid().nullable(),
    createdBy: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
    lastUsedAt: p.datetime().nullable(),
    revokedAt: p.datetime().nullable(),
  },
});
export class ApiKey extends ApiKeySchema.class {}
ApiKeySchema.setClass(ApiKey);

export const SessionSchema = defineEntity({
  name: "Session",
  tableName: "sessions",
  properties: {
    id: p.uuid().primary(),
    tokenHash: p.text().unique(),
    userId: p.uuid(),
    /** browser or cli: they differ in idle window. */
    kind: p.text(),
    createdAt: p.datetime().defaultRaw("now()"),
    lastUsedAt: p.datetime().nullable(),
    idleExpiresAt: p.datetime(),
    absoluteMaxAt: p.datetime(),
    revokedAt: p.datetime().nullable(),
  },
});
export class Session extends SessionSchema.class {}
SessionSchema.setClass(Session);


export const entities = [UserSchema, GroupSchema, GroupLeaseSchema, FormerGroupSlugSchema, MembershipSchema, ApiKeySchema, SessionSchema, AuditEntrySchema];
