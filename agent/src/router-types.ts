/**
 * What the agent asks of the router (ARCHITECTURE section 5): one route per front door, each
 * path-mounted service with the upstreams of the colour serving now. The Caddy driver
 * (router.ts) is the implementation.
 */

export interface MountSpec {
  service: string;
  /** `/` or `/prefix` (no trailing slash); the longest mount matching the request path wins. */
  path: string;
  /** `127.0.0.1:<port>` of each replica of the serving colour. */
  upstreams: string[];
}

export interface RouteSpec {
  /** Stable id of the front door: one per (group, app, branch). */
  key: string;
  /** Host names served, e.g. `node-web.dev.localhost`. */
  hosts: string[];
  mounts: MountSpec[];
}

/** How the routing table the router holds differs from the one asked of it. */
export interface RoutingDrift {
  /** The router holds no table at all (Caddy restarted). */
  absent: boolean;
  /** Keys of front doors asked for that the router does not serve. */
  missing: string[];
  /** Keys of front doors the router serves that were not asked for. */
  extra: string[];
  /** Keys of front doors served otherwise than asked: other hosts, mounts or upstreams, or twice. */
  changed: string[];
  /** What surrounds the front doors differs: the listen address, the catch-all (or its place, last), a route of no front door. */
  server: boolean;
}

export interface Router {
  /** Replaces the whole routing table with `routes` (agent start, drift). */
  assertAll(routes: RouteSpec[]): Promise<void>;
  /**
   * Creates or replaces one front door in a single admin call: for a blue/green deploy this is
   * the flip, the swap commit.
   */
  put(route: RouteSpec): Promise<void>;
  /** Removes a front door (undeploy, private app). Idempotent. */
  remove(key: string): Promise<void>;
  /** The keys of the front doors Caddy serves now; null when Caddy does not hold our server (restarted). */
  current(): Promise<string[] | null>;
  /** How the table the router holds differs from `routes`; null when it serves exactly those. */
  drift(routes: RouteSpec[]): Promise<RoutingDrift | null>;
}
