/** The next-branch preview (spec doc 1 section 4.4, GET /api/apps/{app}/branches?next_branch=). */
import { describe, expect, it } from "vitest";
import { nextBranchPreview } from "../src/domain/next-branch.ts";

const row = (branch: string, label: string, isProduction: boolean, databaseEnabled = false) => ({ appName: "shop", branch, branchLabel: label, isProduction, databaseEnabled });
const branches = [row("main", "main", true), row("feature/x", "feature-x", false, true)];

describe("next branch preview", () => {
  it("previews a registrable branch: not production, nothing refused, what a clone could copy", () => {
    expect(nextBranchPreview(branches, "release/1")).toEqual({
      wouldBeProduction: false,
      productionBranch: "main",
      copyRefusal: null,
      cloneComponentsAvailable: { db: true, drives: false, buckets: false },
    });
  });

  it("says why a branch cannot be registered, as registration would", () => {
    expect(nextBranchPreview(branches, "main")).toMatchObject({ wouldBeProduction: null, productionBranch: "main", copyRefusal: { code: "app_exists" } });
    expect(nextBranchPreview(branches, "Feature-X")).toMatchObject({ wouldBeProduction: null, copyRefusal: { code: "branch_collides" } });
    expect(nextBranchPreview(branches, "a..b")).toMatchObject({ wouldBeProduction: null, copyRefusal: { code: "invalid_branch" } });
    expect(nextBranchPreview(branches, "x".repeat(60))).toMatchObject({ wouldBeProduction: null, copyRefusal: { code: "label_too_long" } });
    expect(nextBranchPreview(branches, "dev", new Set(["shop-dev"]))).toMatchObject({ wouldBeProduction: null, copyRefusal: { code: "host_label_taken" } });
    expect(nextBranchPreview(branches, "qa", new Set(["shop-dev"])).copyRefusal).toBeNull();
  });

  it("would make the first branch production, into which nothing is copied", () => {
    expect(nextBranchPreview([], "main")).toMatchObject({ wouldBeProduction: true, productionBranch: null, copyRefusal: { code: "destination_is_production" } });
  });
});
