/**
 * The router driver (ARCHITECTURE section 5): the host's Caddy, driven only through its admin API.
 *
 * The agent owns one server of Caddy's config, `apps.http.servers.platform`, plain HTTP on the
 * router port. Each front door is one route of that server, tagged `"@id": "fd-<key>"` so that the
 * admin API can address it directly (`/id/fd-<key>`); inside it a subroute sends each path mount
 * to the upstreams of the colour serving now. A last catch-all route answers 404 for a host no
 * front door serves.
 *
 * Every change is one admin write, and Caddy applies a config change as a whole: it starts the
 * new config on the listener it already holds, then lets the old one finish the requests in
 * flight. So a `put` that flips a front door's upstreams (a PATCH of its route) is atomic, and no
 * request in flight is failed by it. Only the old config's idle keep-alive connections are closed;
 * a client that had just written a request on one sends it again, as HTTP clients do.
 */
import { caddyAdmin } from "@platform/fleet";
import type { Logger } from "@platform/logger";
import { Mutex } from "./mutex.ts";
import type { MountSpec, RouteSpec, Router, RoutingDrift } from "./router-types.ts";
import { errorText } from "./error-text.ts";

export const ROUTER_SERVER = "platform";
export const NOT_FOUND_BODY = "no app is served at this address\n";
export const NO_MOUNT_BODY = "no service is mounted at this path\n";
export const NO_REPLICA_BODY = "this service has no running replica\n";

const SERVER_PATH = `/config/apps/http/servers/${ROUTER_SERVER}`;
const ROUTE_ID_PREFIX = "fd-";
const ADMIN_TIMEOUT_MS = 10_000;
const TEXT = { "Content-Type": ["text/plain; charset=utf-8"] };
/**
 * A request whose replica refuses the connection (a rolling restart, a crash the supervisor is
 * mending) is tried on the next replica, or on the same one again, for up to this long before the
 * client gets a 502. What is retried is a connection Caddy could not make: a request an app has
 * received is not sent again (but a GET, by newer Caddy's default).
 */
const UPSTREAM_RETRY = "5s";
const UPSTREAM_RETRY_INTERVAL = "100ms";

/** Characters kept as they are in a route id; every other byte becomes `_xx`, so keys come back intact. */
const ID_SAFE = /^[A-Za-z0-9.-]$/;

export function routeId(key: string): string {
  if (key === "") throw new Error("a front door's key must not be empty");
  let id = ROUTE_ID_PREFIX;
  for (const byte of new TextEncoder().encode(key)) {
    const ch = String.fromCharCode(byte);
    id += ID_SAFE.test(ch) ? ch : `_${byte.toString(16).padStart(2, "0")}`;
  }
  return id;
}

/** The key of a route id made by `routeId`; undefined for any other id. */
export function keyOfRouteId(id: string): string | undefined {
  if (!id.startsWith(ROUTE_ID_PREFIX)) return undefined;
  const encoded = id.slice(ROUTE_ID_PREFIX.length);
  if (!/^(?:[A-Za-z0-9.-]|_[0-9a-f]{2})+$/.test(encoded)) return undefined;
  try {
    return decodeURIComponent(encoded.replaceAll("_", "%"));
  } catch {
    return undefined;
  }
}

type CaddyHandler = Record<string, unknown> & { handler: string };

interface CaddyRoute {
  "@id"?: string;
  match?: Record<string, unknown>[];
  handle: CaddyHandler[];
  terminal?: boolean;
}

type CaddyServer = Record<string, unknown> & { routes?: CaddyRoute[] };

function textResponse(status: number, body: string): CaddyHandler {
  return { handler: "static_response", status_code: status, headers: TEXT, body };
}

function checkMountPath(key: string, path: string): void {
  if (!/^\/(?:[^/*?\s]+(?:\/[^/*?\s]+)*)?$/.test(path)) {
    throw new Error(`front door ${key}: mount path '${path}' must be '/' or '/prefix' without a trailing slash or wildcard`);
  }
}

/** `text` as a Go (RE2) regular expression matching it literally. */
function literal(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function mountRoute(mount: MountSpec): CaddyRoute {
  const handle: CaddyHandler[] =
    mount.upstreams.length > 0
      ? [
          {
            handler: "reverse_proxy",
            upstreams: mount.upstreams.map((dial) => ({ dial })),
            load_balancing: { selection_policy: { policy: "round_robin" }, try_duration: UPSTREAM_RETRY, try_interval: UPSTREAM_RETRY_INTERVAL },
          },
        ]
      : [textResponse(503, NO_REPLICA_BODY)];
  // `/api` serves `/api` and everything below it, never `/apix`, nor `/API`: URL paths are
  // case-sensitive, and Caddy's `path` matcher is not. `path_regexp` matches the cleaned path
  // (doubled slashes merged, dot segments resolved), as `path` does.
  return mount.path === "/" ? { handle } : { match: [{ path_regexp: { pattern: `^${literal(mount.path)}(?:/|$)` } }], handle };
}

/** One front door as a route of the `platform` server. */
export function frontDoorRoute(route: RouteSpec): CaddyRoute {
  if (route.hosts.length === 0) throw new Error(`front door ${route.key} has no host name`);
  const seen = new Set<string>();
  for (const mount of route.mounts) {
    checkMountPath(route.key, mount.path);
    if (seen.has(mount.path)) throw new Error(`front door ${route.key}: path ${mount.path} is mounted twice`);
    seen.add(mount.path);
  }
  // Caddy runs a subroute's routes in order and the first reverse_proxy answers: longest path first.
  const routes = [...route.mounts].sort((a, b) => b.path.length - a.path.length).map(mountRoute);
  if (!seen.has("/")) routes.push({ handle: [textResponse(404, NO_MOUNT_BODY)] });
  return {
    "@id": routeId(route.key),
    match: [{ host: route.hosts }],
    handle: [{ handler: "subroute", routes }],
    terminal: true,
  };
}

/** The whole `platform` server: the front doors, then the catch-all. */
export function routerServer(routes: RouteSpec[], listenPort: number): CaddyServer {
  const keys = new Set<string>();
  for (const route of routes) {
    if (keys.has(route.key)) throw new Error(`front door ${route.key} is listed twice`);
    keys.add(route.key);
  }
  return {
    listen: [`:${listenPort}`],
    // Plain HTTP only: no certificate is asked for and no redirect to HTTPS is added.
    automatic_https: { disable: true },
    routes: [...routes.map(frontDoorRoute), { handle: [textResponse(404, NOT_FOUND_BODY)] }],
  };
}

/** The key of the front door a route of the `platform` server is; undefined for any other route. */
function frontDoorKey(route: CaddyRoute): string | undefined {
  const id: unknown = route["@id"];
  return typeof id === "string" ? keyOfRouteId(id) : undefined;
}

/** JSON with every object's keys sorted: Caddy answers a config with its keys in Go's order, not in ours. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    v !== null && typeof v === "object" && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v,
  );
}

/**
 * A routing table as its front doors (by key, each route as canonical JSON: two if Caddy was
 * given a second route with an id it holds) and the rest of the server. Front doors match
 * disjoint hosts, so their order is free (`put` adds one at index 0); the routes around them keep
 * theirs, and the last route must be the catch-all, or it hides the front doors after it.
 */
function tableParts(server: CaddyServer): { frontDoors: Map<string, string[]>; rest: string } {
  const routes = server.routes ?? [];
  const frontDoors = new Map<string, string[]>();
  const others: CaddyRoute[] = [];
  for (const route of routes) {
    const key = frontDoorKey(route);
    if (key === undefined) others.push(route);
    else frontDoors.set(key, [...(frontDoors.get(key) ?? []), canonical(route)]);
  }
  return { frontDoors, rest: canonical([{ ...server, routes: others }, routes.at(-1) ?? null]) };
}

/** How the table Caddy holds differs from the one wanted; null when it serves the same. */
function tableDrift(held: CaddyServer, wanted: CaddyServer): RoutingDrift | null {
  const h = tableParts(held);
  const w = tableParts(wanted);
  // JSON text holds no raw newline, so joined routes compare exactly.
  const same = (key: string) => h.frontDoors.get(key)?.join("\n") === w.frontDoors.get(key)?.join("\n");
  const drift: RoutingDrift = {
    absent: false,
    missing: [...w.frontDoors.keys()].filter((key) => !h.frontDoors.has(key)),
    extra: [...h.frontDoors.keys()].filter((key) => !w.frontDoors.has(key)),
    changed: [...w.frontDoors.keys()].filter((key) => h.frontDoors.has(key) && !same(key)),
    server: h.rest !== w.rest,
  };
  const drifted = drift.missing.length > 0 || drift.extra.length > 0 || drift.changed.length > 0 || drift.server;
  return drifted ? drift : null;
}

interface AdminReply {
  status: number;
  text: string;
}

export interface CaddyRouterOptions {
  /** Caddy's admin API: `http://127.0.0.1:2019` or `unix:///path/to/admin.sock`. */
  adminUrl: string;
  /** The port the `platform` server serves every front door on. */
  listenPort: number;
  logger?: Logger;
}

export class CaddyRouter implements Router {
  readonly adminUrl: string;
  readonly listenPort: number;
  private readonly logger: Logger | undefined;
  /**
   * Changes run one at a time: `put` reads before it creates, and Caddy accepts a second route
   * with an `@id` it already holds, so two interleaved creates of one key would leave two.
   */
  private readonly changes = new Mutex();

  constructor(opts: CaddyRouterOptions) {
    this.adminUrl = opts.adminUrl.replace(/\/+$/, "");
    this.listenPort = opts.listenPort;
    this.logger = opts.logger;
  }

  async current(): Promise<string[] | null> {
    const server = (await this.read(SERVER_PATH)) as CaddyServer | null;
    if (server === null) return null;
    return (server.routes ?? []).map(frontDoorKey).filter((key) => key !== undefined);
  }

  async drift(routes: RouteSpec[]): Promise<RoutingDrift | null> {
    const wanted = routerServer(routes, this.listenPort);
    const held = (await this.read(SERVER_PATH)) as CaddyServer | null;
    if (held === null) return { absent: true, missing: routes.map((r) => r.key), extra: [], changed: [], server: true };
    return tableDrift(held, wanted);
  }

  async assertAll(routes: RouteSpec[]): Promise<void> {
    const server = routerServer(routes, this.listenPort);
    return this.changes.run(async () => {
      // POST replaces an existing server; PUT creates it, with the http app around it if need be.
      const exists = (await this.read(SERVER_PATH)) !== null;
      await this.write(exists ? "POST" : "PUT", SERVER_PATH, server);
      this.logger?.info({ front_doors: routes.length, port: this.listenPort }, "router table asserted");
    });
  }

  async put(route: RouteSpec): Promise<void> {
    const caddyRoute = frontDoorRoute(route);
    const id = caddyRoute["@id"]!;
    return this.changes.run(async () => {
      const patched = await this.admin("PATCH", `/id/${id}`, caddyRoute);
      if (patched.status === 200) {
        this.logger?.info({ route: route.key, hosts: route.hosts }, "front door replaced");
        return;
      }
      if (patched.status !== 404) throw this.failure("PATCH", `/id/${id}`, patched);
      if ((await this.read(`${SERVER_PATH}/routes`)) === null) {
        throw new Error(
          `cannot add front door ${route.key}: Caddy at ${this.adminUrl} holds no '${ROUTER_SERVER}' server (restarted?); the routing table must be asserted first`,
        );
      }
      // Front doors match disjoint hosts, so their order does not matter; index 0 keeps the new
      // one ahead of the catch-all, which must stay last.
      await this.write("PUT", `${SERVER_PATH}/routes/0`, caddyRoute);
      this.logger?.info({ route: route.key, hosts: route.hosts }, "front door added");
    });
  }

  async remove(key: string): Promise<void> {
    const id = routeId(key);
    return this.changes.run(async () => {
      const reply = await this.admin("DELETE", `/id/${id}`);
      if (reply.status !== 200 && reply.status !== 404) throw this.failure("DELETE", `/id/${id}`, reply);
      if (reply.status === 200) this.logger?.info({ route: key }, "front door removed");
    });
  }

  /** The config at `path`; null when it is absent. */
  private async read(path: string): Promise<unknown> {
    const reply = await this.admin("GET", path);
    // Caddy answers null for a missing key, but 400 when a parent of it is missing too (no http app).
    if (reply.status === 400 && reply.text.includes("invalid traversal path")) return null;
    if (reply.status !== 200) throw this.failure("GET", path, reply);
    return JSON.parse(reply.text) as unknown;
  }

  private async write(method: string, path: string, body: unknown): Promise<void> {
    const reply = await this.admin(method, path, body);
    if (reply.status !== 200) throw this.failure(method, path, reply);
  }

  private async admin(method: string, path: string, body?: unknown): Promise<AdminReply> {
    try {
      return await caddyAdmin(this.adminUrl, method, path, { body: body === undefined ? undefined : JSON.stringify(body), timeoutMs: ADMIN_TIMEOUT_MS });
    } catch (err) {
      throw new Error(`Caddy admin API at ${this.adminUrl} is not reachable (${(err as NodeJS.ErrnoException).code ?? errorText(err)})`, { cause: err });
    }
  }

  private failure(method: string, path: string, reply: AdminReply): Error {
    let message = reply.text.trim();
    try {
      const parsed = JSON.parse(reply.text) as { error?: unknown };
      if (typeof parsed.error === "string") message = parsed.error;
    } catch {
      // not JSON: keep Caddy's text as it is
    }
    return new Error(`Caddy admin API: ${method} ${path} answered ${reply.status}: ${message || "(no message)"}`);
  }
}
