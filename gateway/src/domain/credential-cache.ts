/**
 * A short-lived cache of verified credentials, so most requests make no identity hop. An entry
 * lives at most `ttlMs` and never past the credential's own validity (a session's idle window or
 * absolute cap); a revocation event drops it at once on every gateway replica, and so does the
 * rename or deletion of a group the principal names (its key's group, a membership, its personal
 * group), whose slug the cached principal would otherwise keep serving.
 */
import type { Principal } from "@platform/proto";

interface Entry {
  principal: Principal;
  expiresAt: number;
}

export class CredentialCache {
  readonly #ttlMs: number;
  readonly #maxEntries: number;
  readonly #byDigest = new Map<string, Entry>();
  readonly #digestsById = new Map<string, Set<string>>();

  constructor(ttlMs: number, maxEntries = 50_000) {
    this.#ttlMs = ttlMs;
    this.#maxEntries = maxEntries;
  }

  get(digest: string, now = Date.now()): Principal | null {
    const entry = this.#byDigest.get(digest);
    if (!entry) return null;
    if (entry.expiresAt <= now) {
      this.#remove(digest, entry.principal.id);
      return null;
    }
    return entry.principal;
  }

  set(digest: string, principal: Principal, now = Date.now()): void {
    if (this.#ttlMs <= 0) return;
    const validUntil = Number(principal.validUntilMs);
    const expiresAt = Math.min(now + this.#ttlMs, validUntil > 0 ? validUntil : Number.POSITIVE_INFINITY);
    if (expiresAt <= now) return;
    if (this.#byDigest.size >= this.#maxEntries) {
      // Map iteration order is insertion order: drop the oldest entry.
      const oldest = this.#byDigest.keys().next().value;
      if (oldest !== undefined) this.#remove(oldest, this.#byDigest.get(oldest)?.principal.id ?? "");
    }
    this.#byDigest.set(digest, { principal, expiresAt });
    let digests = this.#digestsById.get(principal.id);
    if (!digests) this.#digestsById.set(principal.id, (digests = new Set()));
    digests.add(digest);
  }

  /** Drops every cached credential of a key or session id. */
  invalidate(principalId: string): void {
    for (const digest of this.#digestsById.get(principalId) ?? []) this.#byDigest.delete(digest);
    this.#digestsById.delete(principalId);
  }

  /** Drops every cached credential whose principal names the group `slug`. */
  invalidateGroup(slug: string): void {
    for (const [digest, { principal }] of this.#byDigest) {
      if (principal.keyGroup === slug || principal.user?.personalGroup === slug || principal.memberships.some((m) => m.groupSlug === slug)) {
        this.#remove(digest, principal.id);
      }
    }
  }

  get size(): number {
    return this.#byDigest.size;
  }

  #remove(digest: string, principalId: string): void {
    this.#byDigest.delete(digest);
    const digests = this.#digestsById.get(principalId);
    digests?.delete(digest);
    if (digests?.size === 0) this.#digestsById.delete(principalId);
  }
}
