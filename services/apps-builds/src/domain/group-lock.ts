/**
 * The group lock of registration (spec doc 1 sections 4.4 and 7). identity, the owner of groups,
 * keeps it; a registration (POST /api/apps, and POST /api/builds registering an unknown app) holds
 * it shared for the length of its write, so a rename or delete of the group never lands in the
 * middle of one, and two registrations in one group never wait for each other. What the lease
 * answers becomes the spec's refusals:
 * - still held by a rename or delete after a few seconds: 409 `group_busy` with `retry_after`;
 * - the group renamed while the registration waited: 409 `group_renamed_during_registration`
 *   with the current slug; deleted while it waited: 404; nothing written either way;
 * - the lease lost during the write (it expired) and the group renamed or deleted meanwhile:
 *   409 `group_renamed_during_registration` / `group_deleted_during_registration`, and the write
 *   rolls back.
 */
import type { Client } from "@connectrpc/connect";
import type { GroupLease, GroupLeaseOutcome, IdentityService } from "@platform/proto";
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import { rekeyGroup } from "./group-rename.ts";

/** "Within a few seconds": and well inside the gateway's deadline for the whole request. */
export const REGISTRATION_WAIT_MS = 3_000;
/** Far longer than a registration's write; how long a crashed registration keeps renames out. */
export const REGISTRATION_LEASE_TTL_MS = 15_000;

/** identity's group lock RPCs. */
export type GroupLock = Pick<Client<typeof IdentityService>, "acquireGroupLease" | "confirmGroupLease" | "releaseGroupLease">;

/** Runs its argument in one transaction (ServiceContext.write). */
export type Transact = <T>(fn: (em: EntityManager) => Promise<T>) => Promise<T>;

function groupBusy(slug: string, retryAfterS: number): PlatformError {
  return PlatformError.conflict({
    code: "group_busy",
    message: `Group '${slug}' is being renamed or deleted; retry in ${retryAfterS} s.`,
    retry_after: retryAfterS,
  });
}

/** `when`: said only when known; a slug named at the start may have been renamed long before. */
function renamed(slug: string, current: string, when?: string): PlatformError {
  return PlatformError.conflict({
    code: "group_renamed_during_registration",
    message: `Group '${slug}' was renamed to '${current}'${when ? ` ${when}` : ""}; nothing was registered. Register again in '${current}'.`,
    group_slug: current,
  });
}

/** What the lease request came to, once the registration has waited for it. */
export function leaseOrRefusal(slug: string, o: GroupLeaseOutcome): GroupLease {
  switch (o.outcome) {
    case "granted":
      if (o.lease) return o.lease;
      break;
    case "busy":
      throw groupBusy(slug, o.retryAfterS);
    case "renamed":
      throw renamed(slug, o.groupSlug);
    case "deleted":
      throw PlatformError.notFound(`Group '${slug}' was deleted while the registration waited for it; nothing was registered.`);
    case "not_found":
      throw PlatformError.notFound(`Group '${slug}' not found`);
  }
  throw new Error(`unexpected group lease outcome '${o.outcome}'`);
}

/** What confirming the lease came to, at the end of the write: anything but `held` rolls it back. */
export function confirmedOrRefusal(slug: string, o: GroupLeaseOutcome): void {
  switch (o.outcome) {
    case "held":
      return;
    case "busy":
      // The lease lapsed and a rename or delete has queued for the group since.
      throw groupBusy(slug, o.retryAfterS);
    case "renamed":
      throw renamed(slug, o.groupSlug, "during the registration");
    case "deleted":
      throw PlatformError.conflict({
        code: "group_deleted_during_registration",
        message: `Group '${slug}' was deleted during the registration; nothing was registered.`,
      });
  }
  throw new Error(`unexpected group lease outcome '${o.outcome}'`);
}

/**
 * Runs a registration's write in one transaction under a shared lease on the group: waits for the
 * lease, writes, confirms the lease before the commit (so a group renamed or deleted meanwhile
 * rolls the write back), and releases it.
 */
export async function underGroupLock<T>(lock: GroupLock, transact: Transact, groupSlug: string, holder: string, write: (em: EntityManager) => Promise<T>): Promise<T> {
  const lease = leaseOrRefusal(
    groupSlug,
    await lock.acquireGroupLease({ groupSlug, mode: "shared", holder, ttlMs: REGISTRATION_LEASE_TTL_MS, waitMs: REGISTRATION_WAIT_MS }),
  );
  try {
    return await transact(async (em) => {
      // A rename may be in identity before its event is here: the registration must see the
      // group's apps under the slug it writes.
      await rekeyGroup(em, lease.formerSlugs, lease.groupSlug);
      const result = await write(em);
      await em.flush();
      confirmedOrRefusal(groupSlug, await lock.confirmGroupLease({ lease, ttlMs: REGISTRATION_LEASE_TTL_MS }));
      return result;
    });
  } finally {
    // A release that fails leaves the lease to expire.
    await lock.releaseGroupLease({ leaseId: lease.id }).catch(() => undefined);
  }
}
