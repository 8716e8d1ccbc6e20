/**
 * Accounts, memberships and session minting. The sign-in flows (doc 1 section 4.2) call these;
 * until they land, tests use them to set up members.
 */
import { randomUUID } from "node:crypto";
import { audit, type EntityManager } from "@platform/db";
import { PlatformError } from "@platform/errors";
import { ROLES, type Role } from "@platform/caller";
import { Group, Membership, Session, User } from "../entities/index.ts";
import { generateSessionToken, hashCredential } from "./credentials.ts";
import { initialWindow, type SessionKind } from "./sessions.ts";

function personalSlug(email: string): string {
  const local = email.split("@")[0] ?? "user";
  const base = local.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 40) || "user";
  return `${base}-${randomUUID().slice(0, 6)}`;
}

/** A new account with its personal group, owned by it. */
export async function createUser(
  em: EntityManager,
  input: { email: string; displayName?: string; platformAdmin?: boolean; emailVerified?: boolean },
): Promise<User> {
  const email = input.email.trim().toLowerCase();
  if (!/^[^@\s]+@[^@\s]+$/.test(email)) throw PlatformError.invalid("email is not a valid address.");
  if (await em.findOne(User, { email })) throw PlatformError.conflict({ code: "user_exists", message: `An account for ${email} already exists.` });
  const group = em.create(Group, { id: randomUUID(), slug: personalSlug(email), displayName: email, personal: true });
  const user = em.create(User, {
    id: randomUUID(),
    email,
    displayName: input.displayName ?? email,
    platformAdmin: input.platformAdmin ?? false,
    emailVerified: input.emailVerified ?? true,
    personalGroupId: group.id,
  });
  em.create(Membership, { userId: user.id, groupId: group.id, role: "owner" });
  audit(em, { actor: "system", action: "user.create", target: user.id, groupSlug: group.slug, details: { email } });
  return user;
}

export async function addMembership(em: EntityManager, userId: string, groupSlug: string, role: Role): Promise<void> {
  if (!ROLES.includes(role)) throw PlatformError.invalid(`role must be one of ${ROLES.join(", ")}.`);
  const group = await em.findOne(Group, { slug: groupSlug });
  if (!group) throw PlatformError.notFound(`Group '${groupSlug}' not found`);
  const existing = await em.findOne(Membership, { userId, groupId: group.id });
  if (existing) existing.role = role;
  else em.create(Membership, { userId, groupId: group.id, role });
  audit(em, { actor: "system", action: "membership.set", target: userId, groupSlug, details: { role } });
}

/** Mints a session; the raw token is returned once and only its hash is kept. */
export function mintSession(em: EntityManager, userId: string, kind: SessionKind, now = new Date()): { session: Session; token: string } {
  const token = generateSessionToken();
  const window = initialWindow(kind, now);
  const session = em.create(Session, {
    id: randomUUID(),
    tokenHash: hashCredential(token),
    userId,
    kind,
    createdAt: now,
    idleExpiresAt: window.idleExpiresAt,
    absoluteMaxAt: window.absoluteMaxAt,
  });
  return { session, token };
}
