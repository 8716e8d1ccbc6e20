/**
 * Helpers of the fleet tests: plain HTTP against the gateway, and setting up members. Sign-in
 * routes arrive with their own issue; until then members and their sessions are created with
 * identity's own domain functions on the fleet's database, the same code sign-in will call.
 */
import http from "node:http";
import { openDatabase } from "@platform/db";
import { entities } from "../../services/identity/src/entities/index.ts";
import { migrations } from "../../services/identity/src/migrations/0001_identity.ts";
import { groupLockMigrations } from "../../services/identity/src/migrations/0002_group_lock.ts";
import { addMembership, createUser, mintSession } from "../../services/identity/src/domain/users.ts";
import type { Role } from "@platform/caller";
import type { TestFleet } from "@platform/testing";

export interface Answer<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

export async function call<T = any>(
  base: string,
  method: string,
  path: string,
  opts: { credential?: string; body?: unknown; headers?: Record<string, string>; raw?: string } = {},
): Promise<Answer<T>> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.credential !== undefined) headers.authorization = `Bearer ${opts.credential}`;
  let body: string | undefined;
  if (opts.raw !== undefined) {
    body = opts.raw;
    headers["content-type"] ??= "application/json";
  } else if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers["content-type"] = "application/json";
  }
  const res = await fetch(`${base}${path}`, { method, headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  if (res.headers.get("content-type")?.includes("application/json") && text) parsed = JSON.parse(text);
  return { status: res.status, body: parsed as T, headers: res.headers };
}

export interface Member {
  email: string;
  token: string;
  userId: string;
  personalGroup: string;
}

/** A user with memberships and a session of the given kind. */
export async function seedMember(
  fleet: TestFleet,
  init: { email: string; memberships?: Array<[string, Role]>; platformAdmin?: boolean; disabled?: boolean; kind?: "browser" | "cli" },
): Promise<Member> {
  const orm = await openDatabase({ url: fleet.databaseUrl, schema: "identity", entities, migrations: [...migrations, ...groupLockMigrations], poolMax: 2 });
  try {
    return await orm.em.fork().transactional(async (em) => {
      const user = await createUser(em, { email: init.email, platformAdmin: init.platformAdmin });
      user.disabled = init.disabled ?? false;
      await em.flush();
      for (const [group, role] of init.memberships ?? []) await addMembership(em, user.id, group, role);
      const { token } = mintSession(em, user.id, init.kind ?? "browser");
      await em.flush();
      const me = await em.getConnection().execute<{ slug: string }[]>("select slug from groups where id = ?", [user.personalGroupId], "all", em.getTransactionContext());
      return { email: user.email, token, userId: user.id, personalGroup: me[0]?.slug ?? "" };
    });
  } finally {
    await orm.close(true);
  }
}

/** Polls `read` until `done` holds (usable in hooks, where expect.poll is not). */
export async function waitFor<T>(read: () => Promise<T>, done: (value: T) => boolean, timeoutMs = 30_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > until) throw new Error(`timed out waiting; last value ${JSON.stringify(value)}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * A GET of an app's public URL through the router. App host names (`<app>.<env>.localhost`)
 * need no DNS here: the request goes to 127.0.0.1 on the URL's port with the Host header the
 * browser would send. A new connection per request, as a curl loop makes.
 */
export function viaRouter(url: string, timeoutMs = 5_000): Promise<{ status: number; body: string }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.get(
      { host: "127.0.0.1", port: Number(u.port || 80), path: `${u.pathname}${u.search}`, headers: { host: u.host }, agent: false, timeout: timeoutMs },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error(`GET ${url} timed out`)));
    req.on("error", reject);
  });
}
