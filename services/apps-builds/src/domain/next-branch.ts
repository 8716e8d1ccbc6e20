/**
 * The next-branch preview of GET /api/apps/{app}/branches?next_branch= (spec doc 1 section 4.4):
 * what registering that branch would meet, said before anyone tries. It applies the rules
 * registration enforces (registration.ts) and enforces nothing itself.
 */
import type { App } from "../entities/index.ts";
import { branchLabel, checkBranch, checkBranchHostLabel, hostLabelTaken } from "./naming.ts";

export interface NextBranchPreview {
  /** null: the branch cannot be registered (taken, colliding or not a valid name). */
  wouldBeProduction: boolean | null;
  productionBranch: string | null;
  /** Why copying variables or data into it would be refused; null when it would not be. */
  copyRefusal: { code: string; message: string } | null;
  /** What a clone_data_from_branch could copy from the app's branches. */
  cloneComponentsAvailable: { db: boolean; drives: boolean; buckets: boolean };
}

/** `takenHostLabels`: the host labels other apps answer to, among those the branch could have. */
export function nextBranchPreview(
  branches: Pick<App, "appName" | "branch" | "branchLabel" | "isProduction" | "databaseEnabled">[],
  nextBranch: string,
  takenHostLabels: ReadonlySet<string> = new Set(),
): NextBranchPreview {
  const production = branches.find((b) => b.isProduction) ?? null;
  const base = {
    productionBranch: production?.branch ?? null,
    // No branch has drives or buckets before the storage work provides them.
    cloneComponentsAvailable: { db: branches.some((b) => b.databaseEnabled), drives: false, buckets: false },
  };
  const refused = (code: string, message: string): NextBranchPreview => ({ ...base, wouldBeProduction: null, copyRefusal: { code, message } });

  let branch: string;
  let label: string;
  try {
    branch = checkBranch(nextBranch);
    label = branchLabel(branch);
  } catch (err) {
    return refused("invalid_branch", err instanceof Error ? err.message : `'${nextBranch}' is not a valid branch name.`);
  }
  const appName = branches[0]?.appName ?? "";
  if (branches.some((b) => b.branch === branch)) return refused("app_exists", `App '${appName}' already has branch '${branch}'.`);
  const sibling = branches.find((b) => b.branchLabel === label);
  if (sibling) return refused("branch_collides", `Branch '${branch}' collides with branch '${sibling.branch}' of '${appName}' once sanitised to '${label}'.`);
  if (branches.length > 0) {
    try {
      checkBranchHostLabel(appName, label);
    } catch (err) {
      return refused("label_too_long", err instanceof Error ? err.message : `Branch '${branch}' makes too long a host label.`);
    }
    if (takenHostLabels.has(`${appName}-${label}`)) return refused("host_label_taken", hostLabelTaken(appName, label).message);
  }
  // Registration makes a branch production only when the app has none (registration.ts).
  const wouldBeProduction = branches.length === 0;
  return {
    ...base,
    wouldBeProduction,
    copyRefusal: wouldBeProduction
      ? { code: "destination_is_production", message: `Branch '${branch}' would be the production branch of '${appName}'; nothing is copied into production.` }
      : null,
  };
}
