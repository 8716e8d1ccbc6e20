/**
 * Front doors (spec doc 1 section 2.1, ARCHITECTURE section 5): an app's public address is
 * `<app>[-<branch>].<environment>.<domain>` on the router's port (the production branch goes
 * without the branch label). `urls` and `services[].url` are rebuilt from this routing shape on
 * every read and never stored: a path-mounted service is the front door with its mount suffix,
 * an unrouted (background or mount-less) service has no URL, a private app has no public front
 * door, and nothing has a URL while nothing serves.
 */
import { routedServices, type AppConfig } from "@platform/app-config";
import type { App } from "../entities/index.ts";
import { effectiveConfig, type BaseConfig, type Overlay } from "./overlay.ts";

export interface RouterSettings {
  environment: string;
  domain: string;
  /** The router's public port; 80 is left out of URLs. */
  port: number;
}

type FrontDoorApp = Pick<App, "appName" | "branchLabel" | "isProduction" | "visibility">;

export function frontDoorHost(app: FrontDoorApp, router: RouterSettings): string {
  const name = app.isProduction ? app.appName : `${app.appName}-${app.branchLabel}`;
  return `${name}.${router.environment}.${router.domain}`.toLowerCase();
}

/** The host names the router serves for the app: none for a private app. */
export function publicHosts(app: FrontDoorApp, router: RouterSettings): string[] {
  return app.visibility === "private" ? [] : [frontDoorHost(app, router)];
}

function origin(host: string, router: RouterSettings): string {
  return router.port === 80 ? `http://${host}` : `http://${host}:${router.port}`;
}

/** The app's effective config: the repository's (as the last build read it) with the dashboard overlay. */
export function appConfigOf(app: Pick<App, "baseConfig" | "overlay">): AppConfig | null {
  if (!app.baseConfig) return null;
  return effectiveConfig(app.baseConfig as BaseConfig, (app.overlay ?? {}) as Overlay) as AppConfig;
}

export interface ServiceUrl {
  name: string;
  url: string | null;
  /** The serving release runs it (a service only the saved config declares does not, until a deploy). */
  inServingRelease: boolean;
}

type AddressedApp = FrontDoorApp & Pick<App, "baseConfig" | "overlay" | "deployStatus" | "runningVersion" | "runningMounts" | "serviceNames" | "primaryOverrides">;

/** Whether something serves the branch now (the route exists). */
export function isServing(app: Pick<App, "deployStatus" | "runningVersion">): boolean {
  return app.deployStatus !== "undeployed" && app.deployStatus !== "undeploying" && !!app.runningVersion;
}

/**
 * The app's services with their URLs. The names are the app's config's (what the next deploy
 * runs) plus any service the serving release still runs; the mounts are the serving release's as
 * its agent reported them, so a service added or re-mounted by save-config has no URL (or its old
 * one) until a deploy routes it. A release reported without mounts falls back to the config's.
 */
export function serviceUrls(app: AddressedApp, router: RouterSettings): ServiceUrl[] {
  const config = appConfigOf(app);
  const configured = config?.services ? Object.keys(config.services) : app.serviceNames;
  const serving = isServing(app);
  const live = serving ? app.runningMounts : null;
  // In the order the config declares them (serviceNames, from the config as built): the stored
  // config is jsonb, which keeps its keys in an order of its own.
  const declared = new Map(app.serviceNames.map((name, i) => [name, i]));
  const names = [...new Set([...configured, ...Object.keys(live ?? {})])].sort(
    (a, b) => (declared.get(a) ?? Number.MAX_SAFE_INTEGER) - (declared.get(b) ?? Number.MAX_SAFE_INTEGER),
  );
  const hosts = serving ? publicHosts(app, router) : [];
  const mounts = live
    ? new Map(Object.entries(live).filter((e): e is [string, string] => e[1] !== null))
    : new Map(config ? routedServices(config).map(({ name, service }) => [name, service.mount!]) : []);
  return names.map((name) => {
    const mount = mounts.get(name);
    // An undeploy in flight still has the release running until it has stopped it.
    const inServingRelease = app.deployStatus !== "undeployed" && !!app.runningVersion && (app.runningMounts ? name in app.runningMounts : true);
    if (!hosts[0] || mount === undefined) return { name, url: null, inServingRelease };
    return { name, url: `${origin(hosts[0], router)}${mount === "/" ? "" : mount}`, inServingRelease };
  });
}

/**
 * Live front doors, from the app's serviceUrls: each routed service that is primary (every one
 * unless overridden), the one at the root first (what opening the app's first URL should show).
 */
export function appUrls(app: Pick<App, "primaryOverrides">, services: ServiceUrl[]): string[] {
  const urls = services.filter((s) => s.url !== null && app.primaryOverrides?.[s.name] !== false).map((s) => s.url!);
  const atRoot = (url: string) => (new URL(url).pathname === "/" ? 0 : 1);
  return [...new Set(urls)].sort((a, b) => atRoot(a) - atRoot(b));
}
