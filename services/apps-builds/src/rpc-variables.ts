/** Connect handlers for environment variables (doc 2 section 4.6): thin, the rules live in domain/variables.ts. */
import { create } from "@bufbuild/protobuf";
import { CopyVariablesFromBranchResponseSchema, VariablesCopyPreviewSchema, VariablesSchema, type Variables } from "@platform/proto";
import { requireCaller } from "@platform/caller";
import {
  copyFromBranch,
  copyPreview,
  deleteVariable,
  getVariables,
  putVariables,
  type VariablesDocument,
} from "./domain/variables.ts";
import type { AppsBuildsContext, Handlers } from "./rpc.ts";

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : undefined);

function variablesMsg(doc: VariablesDocument): Variables {
  return create(VariablesSchema, {
    appName: doc.appName,
    branch: doc.branch,
    variables: doc.variables,
    updatedAt: iso(doc.updatedAt),
    updatedBy: doc.updatedBy ?? undefined,
  });
}

export function variableHandlers(ctx: AppsBuildsContext): Handlers {
  return {
    async getVariables(req) {
      const caller = requireCaller(req.caller);
      return variablesMsg(await ctx.read((em) => getVariables(em, caller, req.appName, req.branch || undefined)));
    },

    async putVariables(req) {
      const caller = requireCaller(req.caller);
      return variablesMsg(await ctx.write((em) => putVariables(em, caller, req.appName, req.branch || undefined, req.variables)));
    },

    async deleteVariable(req) {
      const caller = requireCaller(req.caller);
      return variablesMsg(await ctx.write((em) => deleteVariable(em, caller, req.appName, req.branch || undefined, req.key)));
    },

    async previewVariablesCopy(req) {
      const caller = requireCaller(req.caller);
      const p = await ctx.read((em) => copyPreview(em, caller, req.appName, req.branch || undefined, req.sourceBranch));
      return create(VariablesCopyPreviewSchema, {
        appName: p.appName,
        branch: p.branch,
        sourceBranch: p.sourceBranch,
        newKeys: p.new,
        identicalKeys: p.identical,
        conflictKeys: p.conflict,
        destinationUpdatedAt: iso(p.destinationUpdatedAt),
      });
    },

    async copyVariablesFromBranch(req) {
      const caller = requireCaller(req.caller);
      const r = await ctx.write((em) =>
        copyFromBranch(em, caller, req.appName, {
          branch: req.branch,
          sourceBranch: req.sourceBranch,
          onConflict: req.onConflict,
          keys: req.keys,
          expectedUpdatedAt: req.expectedUpdatedAt ?? null,
        }),
      );
      return create(CopyVariablesFromBranchResponseSchema, {
        appName: r.appName,
        branch: r.branch,
        sourceBranch: r.sourceBranch,
        copied: r.copied,
        overwritten: r.overwritten,
        skipped: r.skipped,
        destinationUpdatedAt: iso(r.destinationUpdatedAt),
      });
    },
  };
}
