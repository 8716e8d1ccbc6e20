/** Connect handlers for app settings (doc 1 section 4.4): PATCH, set-production, config layers. */
import type { JsonObject } from "@bufbuild/protobuf";
import { requireCaller } from "@platform/caller";
import { readConfigLayers, saveAppConfig, setProductionBranch, updateApp } from "./domain/app-settings.ts";
import type { Overlay } from "./domain/overlay.ts";
import { bodyOf, routerSettings, singleAppMsg, type AppsBuildsContext, type Handlers } from "./rpc.ts";

/** An overlay as a `google.protobuf.Struct`: `{path: {value, base}}`. */
function overlayJson(overlay: Overlay): JsonObject {
  return Object.fromEntries(Object.entries(overlay).map(([path, entry]) => [path, { value: entry.value, base: entry.base }]));
}

export function settingsHandlers(ctx: AppsBuildsContext): Handlers {
  return {
    async updateApp(req) {
      const caller = requireCaller(req.caller);
      const body = bodyOf(req.patch);
      return ctx.write(async (em) => {
        const updated = await updateApp(em, caller, req.appName, req.branch || undefined, body);
        return { app: await singleAppMsg(em, updated.app, routerSettings(ctx.config)), preflightActionId: updated.preflightActionId ?? undefined };
      });
    },

    async setProductionBranch(req) {
      const caller = requireCaller(req.caller);
      const r = await ctx.write((em) => setProductionBranch(em, caller, req.appName, req.branch));
      return {
        appName: r.appName,
        branch: r.branch,
        previousProductionBranch: r.previousProductionBranch ?? undefined,
        changed: r.changed,
      };
    },

    async getAppConfig(req) {
      const caller = requireCaller(req.caller);
      const layers = await ctx.read((em) => readConfigLayers(em, caller, req.appName, req.branch || undefined));
      return {
        appName: layers.appName,
        branch: layers.branch,
        configPath: layers.configPath,
        base: layers.base ?? undefined,
        overlay: overlayJson(layers.overlay),
        effective: layers.effective ?? undefined,
        sourceMap: layers.sourceMap,
        effectiveYaml: layers.effectiveYaml ?? undefined,
      };
    },

    async saveAppConfig(req) {
      const caller = requireCaller(req.caller);
      const body = bodyOf(req.body);
      const r = await ctx.write((em) => saveAppConfig(em, caller, req.appName, req.branch || undefined, body));
      return {
        overlay: overlayJson(r.overlay),
        changedPaths: r.changedPaths,
        appliesLive: r.appliesLive,
        requiresRedeploy: r.requiresRedeploy,
        preflightActionId: r.preflightActionId,
      };
    },
  };
}
