/**
 * API keys: minting (shown once), listing (never the key or its hash), revocation (announced on
 * the bus so every gateway drops the key from its cache), and the environment's root key.
 */
import { randomUUID } from "node:crypto";
import { PlatformError } from "@platform/errors";
import { audit, enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import { actorOf, isScope, scopeLevel, SCOPES, spansEveryGroup, type Caller } from "@platform/caller";
import { ApiKey, Group } from "../entities/index.ts";
import { API_KEY_PREFIX, displayPrefix, generateApiKey, hashCredential } from "./credentials.ts";
import { findVisibleGroup, groupNotFound } from "./groups.ts";

export interface KeyView {
  key: ApiKey;
  groupSlug: string;
}

export interface MintInput {
  name: string;
  scope: string;
  group?: string;
  platform?: boolean;
}

function keyNotFound(): PlatformError {
  return PlatformError.notFound("API key not found");
}

export async function mintKey(em: EntityManager, caller: Caller, input: MintInput): Promise<{ view: KeyView; secret: string }> {
  const name = input.name.trim();
  // Characters, not UTF-16 units: a name in any script gets its 100.
  const length = [...name].length;
  if (length < 1 || length > 100) throw PlatformError.invalid("name must be 1-100 characters.");
  if (!isScope(input.scope)) throw PlatformError.invalid(`scope must be one of ${SCOPES.join(", ")}.`);
  if (!caller.platformOperator && scopeLevel(input.scope) > scopeLevel(caller.scope)) {
    throw PlatformError.forbidden(`Scope '${input.scope}' exceeds your own scope '${caller.scope}'`);
  }

  let group: Group | null = null;
  if (input.platform) {
    if (!caller.platformOperator) throw PlatformError.forbidden("Only a platform operator may create a platform key.");
    if (input.group) throw PlatformError.invalid("A platform key belongs to no group; omit group.");
  } else {
    const slug = input.group?.trim() || caller.selectedGroup;
    if (!slug) throw PlatformError.invalid("group is required: name the group the key belongs to.");
    group = await findVisibleGroup(em, caller, slug);
    if (!caller.platformOperator && slug !== caller.selectedGroup) {
      throw PlatformError.forbidden(`You may create keys only for the group you act in ('${caller.selectedGroup}'); select '${slug}' with ?group=${slug}.`);
    }
  }

  const secret = generateApiKey();
  const key = em.create(ApiKey, {
    id: randomUUID(),
    prefix: displayPrefix(secret),
    hash: hashCredential(secret),
    name,
    scope: input.scope,
    kind: group ? "group" : "platform",
    groupId: group?.id ?? null,
    createdBy: actorOf(caller),
  });
  audit(em, {
    actor: actorOf(caller),
    action: "key.create",
    target: key.id,
    groupSlug: group?.slug ?? null,
    details: { name, scope: input.scope, kind: key.kind, prefix: key.prefix },
  });
  return { view: { key, groupSlug: group?.slug ?? "" }, secret };
}

/** Operators see every key (or one group's when they select one); others their group's keys. */
export async function listKeys(em: EntityManager, caller: Caller): Promise<KeyView[]> {
  let where = {};
  if (!spansEveryGroup(caller)) {
    const group = await findVisibleGroup(em, caller, caller.selectedGroup);
    where = { groupId: group.id };
  }
  const keys = await em.find(ApiKey, where, { orderBy: { createdAt: "desc", id: "asc" } });
  const groupIds = [...new Set(keys.map((k) => k.groupId).filter((g): g is string => g !== null))];
  const groups = groupIds.length ? await em.find(Group, { id: { $in: groupIds } }) : [];
  const slugById = new Map(groups.map((g) => [g.id, g.slug]));
  return keys.map((key) => ({ key, groupSlug: key.groupId ? (slugById.get(key.groupId) ?? "") : "" }));
}

export async function revokeKey(em: EntityManager, caller: Caller, id: string): Promise<void> {
  if (!/^[0-9a-f-]{36}$/i.test(id)) throw keyNotFound();
  const key = await em.findOne(ApiKey, { id });
  if (!key) throw keyNotFound();
  let groupSlug: string | null = null;
  if (key.groupId) groupSlug = (await em.findOne(Group, { id: key.groupId }))?.slug ?? null;
  if (!caller.platformOperator && (groupSlug === null || groupSlug !== caller.selectedGroup)) throw keyNotFound();
  if (key.kind === "root") {
    throw PlatformError.conflict({
      code: "root_key_protected",
      message: "The environment's root key cannot be revoked through the API; rotate PLATFORM_ROOT_KEY instead.",
    });
  }
  if (key.revokedAt) return;
  key.revokedAt = new Date();
  audit(em, { actor: actorOf(caller), action: "key.revoke", target: key.id, groupSlug, details: { name: key.name, prefix: key.prefix } });
  enqueueEvent(em, subjects.events.credentialRevoked, { kind: "api_key", id: key.id });
}

/**
 * Seeds PLATFORM_ROOT_KEY on start. Idempotent: the same key is left alone; a different one
 * replaces (and revokes) the previous root key, so rotating the secret rotates the key.
 */
export async function seedRootKey(em: EntityManager, raw: string): Promise<"unchanged" | "seeded" | "rotated"> {
  if (!raw.startsWith(API_KEY_PREFIX) || raw.length < API_KEY_PREFIX.length + 32) {
    throw new Error(`PLATFORM_ROOT_KEY must be a ${API_KEY_PREFIX} key with at least 32 random characters after the prefix`);
  }
  await em.getConnection().execute("select pg_advisory_xact_lock(hashtext('platform.identity.root_key'))", [], "run", em.getTransactionContext());
  const hash = hashCredential(raw);
  const same = await em.findOne(ApiKey, { hash });
  if (same) {
    if (same.kind !== "root" || same.revokedAt) {
      throw new Error("PLATFORM_ROOT_KEY matches a key that is not the live root key; choose a new value");
    }
    return "unchanged";
  }
  const previous = await em.findOne(ApiKey, { kind: "root", revokedAt: null });
  if (previous) {
    previous.revokedAt = new Date();
    enqueueEvent(em, subjects.events.credentialRevoked, { kind: "api_key", id: previous.id });
    // The old row must be revoked before the new one exists: one live root key at a time.
    await em.flush();
  }
  const key = em.create(ApiKey, {
    id: randomUUID(),
    prefix: displayPrefix(raw),
    hash,
    name: "root",
    scope: "admin",
    kind: "root",
    groupId: null,
    createdBy: "system",
  });
  audit(em, { actor: "system", action: previous ? "root_key.rotate" : "root_key.seed", target: key.id, details: { prefix: key.prefix } });
  return previous ? "rotated" : "seeded";
}

export { groupNotFound };
