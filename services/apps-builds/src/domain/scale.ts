/**
 * Scale and primary services (spec doc 1 section 4.4), the apps-builds half: what is saved.
 *
 * Scale writes `services.<name>.replicas` as a dashboard overlay edit (so the next build's
 * repository config does not undo it, and GET config shows it as `dashboard`); deploy-queue
 * checks what is in flight before and redeploys the running image after. A count the service
 * already declares writes nothing (a no-op). An overlay that would replace a whole section and
 * drop repository fields is refused with their paths. The preflight is not re-run: the
 * repository did not change; but an app it quarantines is not scaled (409, as for any deploy).
 *
 * Primary services are per-service overrides read by every URL computation (front-door.ts):
 * a service marked not primary keeps its URL but is left out of the app's `urls`.
 */
import { PlatformError } from "@platform/errors";
import type { EntityManager } from "@platform/db";
import type { Caller } from "@platform/caller";
import { Build, type App } from "../entities/index.ts";
import { findApp } from "./apps.ts";
import { lockApp } from "./app-settings.ts";
import { appConfigOf, isServing } from "./front-door.ts";
import { requirePreflightPassed } from "./preflight.ts";
import { effectiveConfig, overlayWouldDropFields, setOverlayEntry, type BaseConfig, type Overlay } from "./overlay.ts";

export const REPLICAS = { min: 1, max: 3 } as const;

export interface ScaleSaved {
  app: App;
  service: string;
  previous: number;
  requested: number;
  noop: boolean;
  overlayPaths: string[];
}

function declaredServices(app: App): Record<string, { replicas?: number; background?: boolean }> {
  return (appConfigOf(app)?.services ?? {}) as Record<string, { replicas?: number }>;
}

/**
 * The repository config of the release a scale redeploys: the running build's (a rollback runs an
 * older one than the latest build read), else the latest; null when nothing runs.
 */
async function runningBase(em: EntityManager, app: App): Promise<BaseConfig | null> {
  if (!isServing(app)) return null;
  const running = await em.findOne(Build, { appId: app.id, tag: app.runningVersion! }, { fields: ["config"] });
  return ((running?.config ?? app.baseConfig) ?? null) as BaseConfig;
}

export async function setServiceReplicas(em: EntityManager, caller: Caller, appName: string, branch: string, service: string, replicas: number): Promise<ScaleSaved> {
  if (!Number.isInteger(replicas) || replicas < REPLICAS.min || replicas > REPLICAS.max) {
    throw PlatformError.invalid(`replicas must be an integer from ${REPLICAS.min} to ${REPLICAS.max}.`);
  }
  const app = await lockApp(em, await findApp(em, caller, appName, branch || undefined));
  // A scale redeploys the running image: its services are the ones it can scale (when nothing
  // runs, the latest build's tell a 404 from the 409 below).
  const base = await runningBase(em, app);
  const services = base ? ((effectiveConfig(base, (app.overlay ?? {}) as Overlay).services ?? {}) as Record<string, { replicas?: number }>) : declaredServices(app);
  const declared = services[service];
  if (!declared) {
    const message = `App '${app.appName}' (branch ${app.branch}) declares no service '${service}'${base ? " in the release it runs" : ""}.`;
    throw PlatformError.notFound({ code: "service_not_declared", message, service });
  }
  if (!base) {
    throw PlatformError.conflict({ code: "nothing_running", message: `Nothing runs on branch '${app.branch}' of '${app.appName}': deploy it before scaling.` });
  }
  const previous = declared.replicas ?? 1;
  const path = `services.${service}.replicas`;
  if (previous === replicas) return { app, service, previous, requested: replicas, noop: true, overlayPaths: Object.keys(app.overlay ?? {}) };
  // A scale is a deploy of the running image: refused, nothing saved, while preflight quarantines the app.
  requirePreflightPassed(app);
  const overlay = setOverlayEntry(base, (app.overlay ?? {}) as Overlay, path, replicas);
  const removed = overlayWouldDropFields(base, overlay);
  if (removed.length > 0) {
    throw PlatformError.conflict({
      code: "overlay_would_drop_fields",
      message: `Saving replicas for '${service}' would replace a whole section of the repository config and drop ${removed.length} field(s); edit the config instead.`,
      removed_paths: removed,
    });
  }
  app.overlay = overlay;
  return { app, service, previous, requested: replicas, noop: false, overlayPaths: Object.keys(overlay).sort() };
}

export async function setPrimaryServices(em: EntityManager, caller: Caller, appName: string, branch: string, primary: Record<string, boolean>): Promise<App> {
  const app = await lockApp(em, await findApp(em, caller, appName, branch || undefined));
  const declared = declaredServices(app);
  const names = Object.keys(declared).length > 0 ? Object.keys(declared) : app.serviceNames;
  const unknown = Object.keys(primary).filter((s) => !names.includes(s));
  if (unknown.length > 0) throw PlatformError.notFound({ code: "service_not_declared", message: `App '${app.appName}' declares no service ${unknown.map((s) => `'${s}'`).join(", ")}.`, services: unknown });
  app.primaryOverrides = { ...(app.primaryOverrides ?? {}), ...primary };
  return app;
}
