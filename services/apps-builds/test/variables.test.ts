/**
 * Environment variables (spec doc 2 section 4.6) against the real Postgres and NATS, through the
 * Connect API of apps-builds: get, merge, delete, copy-preview and copy-from-branch with its
 * `expected_updated_at` guard and audit; and the `copy_vars_from_branch` rule of registration
 * (doc 1 section 4.4) at the domain level.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { appsBuildsEnv, loadConfig } from "@platform/config";
import { createServiceClient, platformErrorOf } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { makeCaller, type Caller } from "@platform/caller";
import { createTestDatabase, deleteBusStreams, dropDatabase, refusal, testNatsUrl, uniquePrefix } from "@platform/testing";
import type { RunningService } from "@platform/service";
import { build } from "../src/app.ts";
import { App } from "../src/entities/index.ts";
import { AuditEntry } from "@platform/db";
import { Variable, VariableSet } from "../src/entities/variables.ts";
import { registerApp } from "../src/domain/registration.ts";
import { copyVarsForRegistration, putVariables } from "../src/domain/variables.ts";
import { startIdentity, type TestIdentity } from "./identity.ts";

const REPOSITORY = "https://example.com/acme/web.git";
const ISO_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

let databaseUrl: string;
let prefix: string;
let identity: TestIdentity;
let service: RunningService;
let client: ReturnType<typeof createServiceClient<typeof AppsBuildsService>>;

const acme = makeCaller({ kind: "api_key", principalId: "k-acme", scope: "deploy", visibleGroups: ["acme"], selectedGroup: "acme" });
const globex = makeCaller({ kind: "api_key", principalId: "k-globex", scope: "deploy", visibleGroups: ["globex"], selectedGroup: "globex" });


const codeOf = (e: { detail: unknown }) => (typeof e.detail === "object" && e.detail ? (e.detail as { code: string }).code : undefined);

/** Registers `appName` on `branch` through the RPC; each app has its own config path in the one repository. */
async function register(appName: string, branch: string, caller: Caller = acme): Promise<string> {
  const r = await client.registerApp({ caller, appName, repository: REPOSITORY, branch, configPath: `apps/${appName}/platform.yaml` });
  return r.app!.appName;
}

async function put(appName: string, branch: string, variables: Record<string, string>, caller: Caller = acme) {
  return client.putVariables({ caller, appName, branch, variables });
}

beforeAll(async () => {
  databaseUrl = await createTestDatabase();
  prefix = uniquePrefix();
  identity = await startIdentity({ databaseUrl, prefix, groups: ["acme", "globex"] });
  service = await build(
    loadConfig(appsBuildsEnv, {
      DATABASE_URL: databaseUrl,
      NATS_URL: testNatsUrl(),
      BUS_PREFIX: prefix,
      RPC_PORT: "0",
      LOG_LEVEL: "silent",
      IDENTITY_URL: identity.url,
    }),
  );
  client = createServiceClient(AppsBuildsService, `http://127.0.0.1:${service.rpc.port}`);
});

afterAll(async () => {
  await service?.close();
  await identity?.service.close();
  if (databaseUrl) await dropDatabase(databaseUrl);
  if (prefix) await deleteBusStreams(prefix);
});

describe("GET variables", () => {
  beforeAll(async () => {
    await register("getter", "main");
    await register("getter", "staging");
  });

  it("is an empty object with no stamp while the branch has none", async () => {
    const v = await client.getVariables({ caller: acme, appName: "getter", branch: "staging" });
    expect(v).toMatchObject({ appName: "getter", branch: "staging", variables: {} });
    expect(v.updatedAt).toBeUndefined();
    expect(v.updatedBy).toBeUndefined();
  });

  it("defaults to branch main", async () => {
    await put("getter", "main", { ON_MAIN: "1" });
    const v = await client.getVariables({ caller: acme, appName: "getter" });
    expect(v.branch).toBe("main");
    expect(v.variables).toEqual({ ON_MAIN: "1" });
    expect(v.updatedBy).toBe("api_key:k-acme");
    expect(v.updatedAt).toMatch(ISO_MS);
  });

  it("is 404 for an unknown app or branch", async () => {
    expect((await refusal(client.getVariables({ caller: acme, appName: "nothing-here" }))).status).toBe(404);
    expect((await refusal(client.getVariables({ caller: acme, appName: "getter", branch: "nope" }))).status).toBe(404);
  });

  it("defaults to main even when the app has no main branch (404 names it)", async () => {
    await register("mastered", "master");
    const e = await refusal(client.getVariables({ caller: acme, appName: "mastered" }));
    expect(e.status).toBe(404);
    expect(e.detail).toContain("'main'");
  });
});

describe("tenant isolation", () => {
  let theirs: string;

  beforeAll(async () => {
    await register("shared-name", "main");
    await register("shared-name", "staging");
    await put("shared-name", "main", { SECRET: "acme-only" });
    // The name is held by acme, so globex's app gets a suffixed name.
    theirs = await register("shared-name", "main", globex);
    await register(theirs, "staging", globex);
  });

  it("answers 404 for another group's app on every route, like an unknown one", async () => {
    const calls = [
      () => client.getVariables({ caller: globex, appName: "shared-name", branch: "main" }),
      () => client.putVariables({ caller: globex, appName: "shared-name", branch: "staging", variables: { X: "1" } }),
      () => client.deleteVariable({ caller: globex, appName: "shared-name", branch: "main", key: "SECRET" }),
      () => client.previewVariablesCopy({ caller: globex, appName: "shared-name", branch: "staging", sourceBranch: "main" }),
      () => client.copyVariablesFromBranch({ caller: globex, appName: "shared-name", branch: "staging", sourceBranch: "main" }),
      () => client.getVariables({ caller: acme, appName: theirs, branch: "main" }),
      () => client.copyVariablesFromBranch({ caller: acme, appName: theirs, branch: "staging", sourceBranch: "main" }),
    ];
    for (const call of calls) {
      const e = await refusal(call());
      expect(e.status).toBe(404);
      expect(JSON.stringify(e.detail)).not.toContain("acme-only");
    }
    const still = await client.getVariables({ caller: acme, appName: "shared-name", branch: "main" });
    expect(still.variables).toEqual({ SECRET: "acme-only" });
    expect((await client.getVariables({ caller: acme, appName: "shared-name", branch: "staging" })).variables).toEqual({});
  });
});

describe("PUT variables", () => {
  beforeAll(async () => {
    await register("putter", "main");
  });

  it("merges with the existing variables and stamps the whole document", async () => {
    const first = await put("putter", "main", { A: "1", B: "2" });
    expect(first.variables).toEqual({ A: "1", B: "2" });
    const second = await put("putter", "main", { B: "two", C: "" });
    expect(second.variables).toEqual({ A: "1", B: "two", C: "" });
    expect(second.updatedAt).toMatch(ISO_MS);
    expect(Date.parse(second.updatedAt!)).toBeGreaterThan(Date.parse(first.updatedAt!));
    expect((await client.getVariables({ caller: acme, appName: "putter" })).variables).toEqual({ A: "1", B: "two", C: "" });
  });

  it("leaves the stamp as it was when nothing changes", async () => {
    const before = await client.getVariables({ caller: acme, appName: "putter" });
    const same = await put("putter", "main", { A: "1" });
    expect(same.updatedAt).toBe(before.updatedAt);
    const empty = await put("putter", "main", {});
    expect(empty.updatedAt).toBe(before.updatedAt);
  });

  it("moves the stamp forward on every change, even within one millisecond", async () => {
    const stamps: string[] = [];
    for (let i = 0; i < 8; i++) stamps.push((await put("putter", "main", { COUNTER: String(i) })).updatedAt!);
    for (let i = 1; i < stamps.length; i++) expect(Date.parse(stamps[i]!)).toBeGreaterThan(Date.parse(stamps[i - 1]!));
    const set = await service.ctx.read(async (em) => {
      const app = await em.findOneOrFail(App, { appName: "putter", branch: "main" });
      return em.findOneOrFail(VariableSet, { appId: app.id });
    });
    expect(set.updatedAt.toISOString()).toBe(stamps.at(-1));
  });

  it("accepts names of letters, digits and underscores up to 256 characters", async () => {
    const long = `_${"a".repeat(255)}`;
    const r = await put("putter", "main", { _x: "1", lower_case9: "2", [long]: "3" });
    expect(Object.keys(r.variables)).toEqual(expect.arrayContaining(["_x", "lower_case9", long]));
  });

  it("refuses bad names with 422 and writes nothing of the request", async () => {
    const before = await client.getVariables({ caller: acme, appName: "putter" });
    for (const bad of ["9LIVES", "WITH-DASH", "WITH SPACE", "DOT.TED", "", "É", `A${"a".repeat(256)}`, "__proto__"]) {
      const e = await refusal(put("putter", "main", { GOOD_ONE: "x", [bad]: "v" }));
      expect(e.status, bad).toBe(422);
    }
    const after = await client.getVariables({ caller: acme, appName: "putter" });
    expect(after).toEqual(before);
  });

  it("refuses the names the platform sets in every replica itself (PORT, PLATFORM_*), writing nothing", async () => {
    const before = await client.getVariables({ caller: acme, appName: "putter" });
    for (const reserved of ["PORT", "PLATFORM_APP", "PLATFORM_ANYTHING"]) {
      const e = await refusal(put("putter", "main", { GOOD_ONE: "x", [reserved]: "v" }));
      expect(e.status, reserved).toBe(422);
      expect(e.detail, reserved).toContain("reserved");
    }
    expect(await client.getVariables({ caller: acme, appName: "putter" })).toEqual(before);
    // Near misses are ordinary names.
    expect((await put("putter", "main", { PORTS: "1", MY_PORT: "2", PLATFORM: "3" })).variables).toMatchObject({ PORTS: "1", MY_PORT: "2", PLATFORM: "3" });
  });

  it("refuses values over 32 KiB (UTF-8 bytes) or with a NUL character", async () => {
    expect((await put("putter", "main", { MAX: "x".repeat(32 * 1024) })).variables.MAX).toHaveLength(32 * 1024);
    expect((await refusal(put("putter", "main", { TOO_BIG: "x".repeat(32 * 1024 + 1) }))).status).toBe(422);
    // 16385 two-byte characters: under 32768 characters, over 32 KiB.
    expect((await refusal(put("putter", "main", { WIDE: "é".repeat(16385) }))).status).toBe(422);
    expect((await refusal(put("putter", "main", { NUL: "a\u0000b" }))).status).toBe(422);
  });

  it("holds at most 500 variables per branch", async () => {
    await register("crowded", "main");
    const many = Object.fromEntries(Array.from({ length: 499 }, (_, i) => [`K${i}`, "v"]));
    expect(Object.keys((await put("crowded", "main", many)).variables)).toHaveLength(499);
    const e = await refusal(put("crowded", "main", { EXTRA_1: "v", EXTRA_2: "v" }));
    expect(e.status).toBe(422);
    expect(e.detail).toContain("500");
    // Changing existing keys never counts as new ones.
    expect(Object.keys((await put("crowded", "main", { K0: "changed", EXTRA_1: "v" })).variables)).toHaveLength(500);
    expect((await refusal(put("crowded", "main", { ONE_MORE: "v" }))).status).toBe(422);
  });

  it("holds a branch's variables to 1 MiB together, what a replica's environment can take, copies included", async () => {
    await register("bulky", "main");
    await register("bulky", "staging");
    const chunk = (from: number) => Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`BIG_${from + i}`, "x".repeat(32 * 1024 - 16)]));
    for (let from = 0; from < 30; from += 10) await put("bulky", "staging", chunk(from));
    // 30 values of 32 KiB are under 1 MiB; three more pass it.
    const e = await refusal(put("bulky", "staging", { BIG_30: "x".repeat(32 * 1024), BIG_31: "x".repeat(32 * 1024), BIG_32: "x".repeat(32 * 1024) }));
    expect(e).toMatchObject({ status: 422, detail: { code: "variables_too_large", message: expect.stringContaining("at most 1024 KiB") } });
    expect(Object.keys((await client.getVariables({ caller: acme, appName: "bulky", branch: "staging" })).variables)).toHaveLength(30);
    // Changing a value to a smaller one is taken, whatever the total.
    expect((await put("bulky", "staging", { BIG_0: "small" })).variables.BIG_0).toBe("small");
    // A copy that would pass it is refused too, writing nothing.
    await put("bulky", "main", { ...chunk(100), ...chunk(110) });
    const copy = await refusal(client.copyVariablesFromBranch({ caller: acme, appName: "bulky", branch: "staging", sourceBranch: "main", expectedUpdatedAt: (await client.previewVariablesCopy({ caller: acme, appName: "bulky", branch: "staging", sourceBranch: "main" })).destinationUpdatedAt }));
    expect(copy).toMatchObject({ status: 422, detail: { code: "variables_too_large" } });
    expect(Object.keys((await client.getVariables({ caller: acme, appName: "bulky", branch: "staging" })).variables)).toHaveLength(30);
  });

  it("is 404 for a branch the app does not have", async () => {
    expect((await refusal(put("putter", "nope", { A: "1" }))).status).toBe(404);
  });
});

describe("DELETE variable", () => {
  beforeAll(async () => {
    await register("deleter", "main");
    await put("deleter", "main", { KEEP: "k", DROP: "d" });
  });

  it("removes one key and moves the stamp", async () => {
    const before = await client.getVariables({ caller: acme, appName: "deleter" });
    const after = await client.deleteVariable({ caller: acme, appName: "deleter", branch: "main", key: "DROP" });
    expect(after.variables).toEqual({ KEEP: "k" });
    expect(Date.parse(after.updatedAt!)).toBeGreaterThan(Date.parse(before.updatedAt!));
  });

  it("is 404 for a key the branch does not have, 422 for a name that cannot be one", async () => {
    const missing = await refusal(client.deleteVariable({ caller: acme, appName: "deleter", branch: "main", key: "DROP" }));
    expect(missing.status).toBe(404);
    const bad = await refusal(client.deleteVariable({ caller: acme, appName: "deleter", branch: "main", key: "not-a-name" }));
    expect(bad.status).toBe(422);
    expect((await refusal(client.deleteVariable({ caller: acme, appName: "deleter", branch: "nope", key: "KEEP" }))).status).toBe(404);
  });

  it("leaves an empty document with no stamp after the last key", async () => {
    const r = await client.deleteVariable({ caller: acme, appName: "deleter", key: "KEEP" });
    expect(r.variables).toEqual({});
    expect(r.updatedAt).toBeUndefined();
    expect(r.updatedBy).toBeUndefined();
  });
});

describe("copy-preview", () => {
  beforeAll(async () => {
    await register("preview", "main");
    await register("preview", "staging");
    await register("preview", "feature");
    await put("preview", "main", { NEW_ONE: "value-new", SAME: "value-same", DIFFERENT: "value-prod", ALSO_NEW: "value-also" });
    await put("preview", "staging", { SAME: "value-same", DIFFERENT: "value-staging", ONLY_HERE: "value-only" });
  });

  it("classifies the source's keys as new, identical or conflict, names only", async () => {
    const p = await client.previewVariablesCopy({ caller: acme, appName: "preview", branch: "staging", sourceBranch: "main" });
    expect(p).toMatchObject({
      appName: "preview",
      branch: "staging",
      sourceBranch: "main",
      newKeys: ["ALSO_NEW", "NEW_ONE"],
      identicalKeys: ["SAME"],
      conflictKeys: ["DIFFERENT"],
    });
    const staging = await client.getVariables({ caller: acme, appName: "preview", branch: "staging" });
    expect(p.destinationUpdatedAt).toBe(staging.updatedAt);
    expect(JSON.stringify(p)).not.toContain("value-");
  });

  it("gives no destination_updated_at when the destination has none", async () => {
    const p = await client.previewVariablesCopy({ caller: acme, appName: "preview", branch: "feature", sourceBranch: "staging" });
    expect(p.destinationUpdatedAt).toBeUndefined();
    expect(p.newKeys).toEqual(["DIFFERENT", "ONLY_HERE", "SAME"]);
  });

  it("refuses the production branch as destination (409), the same branch (422), an unknown branch (404)", async () => {
    const prod = await refusal(client.previewVariablesCopy({ caller: acme, appName: "preview", branch: "main", sourceBranch: "staging" }));
    expect([prod.status, codeOf(prod)]).toEqual([409, "destination_is_production"]);
    const same = await refusal(client.previewVariablesCopy({ caller: acme, appName: "preview", branch: "staging", sourceBranch: "staging" }));
    expect([same.status, codeOf(same)]).toEqual([422, "same_branch"]);
    expect((await refusal(client.previewVariablesCopy({ caller: acme, appName: "preview", branch: "nope", sourceBranch: "main" }))).status).toBe(404);
    expect((await refusal(client.previewVariablesCopy({ caller: acme, appName: "preview", branch: "staging", sourceBranch: "nope" }))).status).toBe(404);
  });

  it("defaults the destination to main", async () => {
    const e = await refusal(client.previewVariablesCopy({ caller: acme, appName: "preview", sourceBranch: "staging" }));
    expect(codeOf(e)).toBe("destination_is_production");
  });
});

describe("copy-from-branch", () => {
  beforeAll(async () => {
    await register("copier", "main");
    await register("copier", "staging");
    await register("copier", "feature");
    await register("copier", "scratch");
    await put("copier", "main", { NEW_ONE: "n", SAME: "s", DIFFERENT: "prod", SECRET_TOKEN: "hunter2" });
    await put("copier", "staging", { SAME: "s", DIFFERENT: "staging" });
  });

  const preview = (branch: string, sourceBranch: string) => client.previewVariablesCopy({ caller: acme, appName: "copier", branch, sourceBranch });

  it("copies new keys and skips conflicts by default, answering the new stamp", async () => {
    const p = await preview("staging", "main");
    const r = await client.copyVariablesFromBranch({
      caller: acme,
      appName: "copier",
      branch: "staging",
      sourceBranch: "main",
      expectedUpdatedAt: p.destinationUpdatedAt,
    });
    expect(r.copied).toEqual(["NEW_ONE", "SECRET_TOKEN"]);
    expect(r.overwritten).toEqual([]);
    expect(r.skipped).toEqual(["DIFFERENT", "SAME"]);
    expect(r.destinationUpdatedAt).toMatch(ISO_MS);
    expect(r.destinationUpdatedAt).not.toBe(p.destinationUpdatedAt);
    const staging = await client.getVariables({ caller: acme, appName: "copier", branch: "staging" });
    expect(staging.variables).toEqual({ SAME: "s", DIFFERENT: "staging", NEW_ONE: "n", SECRET_TOKEN: "hunter2" });
    expect(staging.updatedAt).toBe(r.destinationUpdatedAt);
    expect((await preview("staging", "main")).destinationUpdatedAt).toBe(r.destinationUpdatedAt);
  });

  it("overwrites conflicts with on_conflict overwrite; identical keys are skipped", async () => {
    const p = await preview("staging", "main");
    const r = await client.copyVariablesFromBranch({
      caller: acme,
      appName: "copier",
      branch: "staging",
      sourceBranch: "main",
      onConflict: "overwrite",
      expectedUpdatedAt: p.destinationUpdatedAt,
    });
    expect(r).toMatchObject({ copied: [], overwritten: ["DIFFERENT"], skipped: ["NEW_ONE", "SAME", "SECRET_TOKEN"] });
    expect((await client.getVariables({ caller: acme, appName: "copier", branch: "staging" })).variables.DIFFERENT).toBe("prod");
  });

  it("narrows the copy to the named keys, each of which the source must have", async () => {
    const p = await preview("feature", "main");
    expect(p.destinationUpdatedAt).toBeUndefined();
    const missing = await refusal(
      client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main", keys: ["SAME", "NOT_THERE"] }),
    );
    expect([missing.status, codeOf(missing)]).toEqual([422, "keys_not_in_source"]);
    expect((await refusal(client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main", keys: ["bad-name"] }))).status).toBe(422);
    const r = await client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main", keys: ["SAME", "SAME"] });
    expect(r).toMatchObject({ copied: ["SAME"], overwritten: [], skipped: [] });
    expect((await client.getVariables({ caller: acme, appName: "copier", branch: "feature" })).variables).toEqual({ SAME: "s" });
  });

  it("is refused 409 when the destination changed since the preview, and writes nothing", async () => {
    const p = await preview("feature", "main");
    await put("copier", "feature", { MOVED_ON: "yes" });
    const e = await refusal(
      client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main", expectedUpdatedAt: p.destinationUpdatedAt }),
    );
    expect([e.status, codeOf(e)]).toEqual([409, "destination_changed"]);
    const now = await client.getVariables({ caller: acme, appName: "copier", branch: "feature" });
    expect((e.detail as unknown as { destination_updated_at: string }).destination_updated_at).toBe(now.updatedAt);
    expect(now.variables).toEqual({ SAME: "s", MOVED_ON: "yes" });
  });

  it("treats a missing expected_updated_at as 'the destination has none'", async () => {
    // feature has variables: an absent (null) expectation is stale.
    const e = await refusal(client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main" }));
    expect(codeOf(e)).toBe("destination_changed");
    // scratch has none: the copy goes through.
    const r = await client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "scratch", sourceBranch: "staging" });
    expect(r.copied).toEqual(["DIFFERENT", "NEW_ONE", "SAME", "SECRET_TOKEN"]);
  });

  it("compares the stamp exactly: a timestamp a millisecond off is stale, garbage is 422", async () => {
    const p = await preview("feature", "main");
    const off = new Date(Date.parse(p.destinationUpdatedAt!) - 1).toISOString();
    const stale = await refusal(
      client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main", expectedUpdatedAt: off }),
    );
    expect(codeOf(stale)).toBe("destination_changed");
    const garbage = await refusal(
      client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "feature", sourceBranch: "main", expectedUpdatedAt: "yesterday" }),
    );
    expect(garbage.status).toBe(422);
  });

  it("lets exactly one of two copies previewed against the same state through", async () => {
    await register("copier", "race");
    await put("copier", "race", { START: "1" });
    const p = await preview("race", "main");
    const attempt = (onConflict: string) =>
      client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch: "race", sourceBranch: "main", onConflict, expectedUpdatedAt: p.destinationUpdatedAt });
    const results = await Promise.allSettled([attempt("skip"), attempt("overwrite"), attempt("skip")]);
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    for (const r of results) if (r.status === "rejected") expect(codeOf(platformErrorOf(r.reason)!)).toBe("destination_changed");
  });

  it("refuses production as destination (409), the same branch (422), unknown branches (404), a bad on_conflict (422)", async () => {
    const copy = (branch: string, sourceBranch: string, onConflict = "") =>
      refusal(client.copyVariablesFromBranch({ caller: acme, appName: "copier", branch, sourceBranch, onConflict }));
    const prod = await copy("main", "staging");
    expect([prod.status, codeOf(prod)]).toEqual([409, "destination_is_production"]);
    const same = await copy("staging", "staging");
    expect([same.status, codeOf(same)]).toEqual([422, "same_branch"]);
    expect((await copy("nope", "main")).status).toBe(404);
    expect((await copy("staging", "nope")).status).toBe(404);
    expect((await copy("staging", "main", "replace")).status).toBe(422);
    expect((await refusal(client.copyVariablesFromBranch({ caller: acme, appName: "no-such-app", branch: "a", sourceBranch: "b" }))).status).toBe(404);
  });

  it("is audited as env_vars_copied with key names only", async () => {
    const rows = await service.ctx.read((em) => em.find(AuditEntry, { action: "env_vars_copied" }, { orderBy: { id: "asc" } }));
    const copier = rows.filter((r) => r.details.app_name === "copier");
    expect(copier.length).toBeGreaterThanOrEqual(4);
    expect(copier[0]).toMatchObject({
      actor: "api_key:k-acme",
      groupSlug: "acme",
      details: { app_name: "copier", branch: "staging", source_branch: "main", on_conflict: "skip", copied: ["NEW_ONE", "SECRET_TOKEN"], overwritten: [], skipped: ["DIFFERENT", "SAME"] },
    });
    for (const row of copier) {
      expect(Object.keys(row.details).sort()).toEqual(["app_name", "branch", "copied", "on_conflict", "overwritten", "skipped", "source_branch"]);
      for (const list of [row.details.copied, row.details.overwritten, row.details.skipped]) {
        for (const key of list as string[]) expect(key).toMatch(/^[A-Z_]+$/);
      }
    }
    expect(JSON.stringify(copier)).not.toContain("hunter2");
    // Refused copies leave no audit row.
    expect(copier.every((r) => r.details.branch !== "main")).toBe(true);
  });
});

describe("copy_vars_from_branch at registration", () => {
  beforeAll(async () => {
    await register("reg", "main");
    await register("reg", "staging");
    await put("reg", "staging", { FROM_STAGING: "st", SHARED: "staging-value" });
  });

  it("copies the source's variables into the new branch and returns the key names", async () => {
    const copied = await service.ctx.write(async (em) => {
      const { app } = await registerApp(em, acme, { appName: "reg", repository: REPOSITORY, branch: "feature-x", configPath: "apps/reg/platform.yaml" }, { allowFileRepos: false });
      return copyVarsForRegistration(em, app, "staging");
    });
    expect(copied).toEqual(["FROM_STAGING", "SHARED"]);
    const v = await client.getVariables({ caller: acme, appName: "reg", branch: "feature-x" });
    expect(v.variables).toEqual({ FROM_STAGING: "st", SHARED: "staging-value" });
    expect(v.updatedBy).toBe("api_key:k-acme");
    const audit = await service.ctx.read((em) => em.find(AuditEntry, { action: "env_vars_copied", target: { $ne: "" } }));
    const row = audit.find((r) => r.details.app_name === "reg" && r.details.branch === "feature-x");
    expect(row?.details).toMatchObject({ source_branch: "staging", copied: ["FROM_STAGING", "SHARED"], via: "registration" });
    expect(JSON.stringify(row)).not.toContain("staging-value");
  });

  it("never overwrites a key the new branch already has", async () => {
    const copied = await service.ctx.write(async (em) => {
      const { app } = await registerApp(em, acme, { appName: "reg", repository: REPOSITORY, branch: "feature-y", configPath: "apps/reg/platform.yaml" }, { allowFileRepos: false });
      await putVariables(em, acme, "reg", "feature-y", { SHARED: "mine" });
      return copyVarsForRegistration(em, app, "staging");
    });
    expect(copied).toEqual(["FROM_STAGING"]);
    expect((await client.getVariables({ caller: acme, appName: "reg", branch: "feature-y" })).variables).toEqual({ SHARED: "mine", FROM_STAGING: "st" });
  });

  it("is 404 when the source is not a branch of this app in the group", async () => {
    for (const source of ["nope", "feature-z"]) {
      const e = await refusal(
        service.ctx.write(async (em) => {
          const { app } = await registerApp(em, acme, { appName: "reg", repository: REPOSITORY, branch: "feature-z", configPath: "apps/reg/platform.yaml" }, { allowFileRepos: false });
          return copyVarsForRegistration(em, app, source);
        }),
      );
      expect(e.status).toBe(404);
    }
    // A branch of another group's app is not a branch of this app.
    const theirs = await register("reg", "main", globex);
    await register(theirs, "staging", globex);
    const e = await refusal(
      service.ctx.write(async (em) => {
        const { app } = await registerApp(em, globex, { appName: theirs, repository: REPOSITORY, branch: "feature-z", configPath: `apps/${theirs}/platform.yaml` }, { allowFileRepos: false });
        // feature-x is a branch of acme's app only.
        return copyVarsForRegistration(em, app, "feature-x");
      }),
    );
    expect(e.status).toBe(404);
    // Nothing of a refused registration was written.
    const rows = await service.ctx.read((em) => em.find(App, { branch: "feature-z" }));
    expect(rows).toHaveLength(0);
  });

  it("is 422 when the app has no other branch", async () => {
    const e = await refusal(
      service.ctx.write(async (em) => {
        const { app } = await registerApp(em, acme, { appName: "lonely", repository: REPOSITORY, branch: "main", configPath: "apps/lonely/platform.yaml" }, { allowFileRepos: false });
        return copyVarsForRegistration(em, app, "staging");
      }),
    );
    expect([e.status, codeOf(e)]).toEqual([422, "no_other_branch"]);
  });

  it("is 409 when the new branch is or would become production", async () => {
    const e = await refusal(
      service.ctx.read(async (em) => {
        // A branch about to be registered as production (not persisted).
        const incoming = Object.assign(new App(), {
          id: "00000000-0000-4000-8000-000000000001",
          appName: "reg",
          groupSlug: "acme",
          branch: "next-prod",
          isProduction: true,
          createdBy: "api_key:k-acme",
        });
        return copyVarsForRegistration(em, incoming, "staging");
      }),
    );
    expect([e.status, codeOf(e)]).toEqual([409, "destination_is_production"]);
  });

  it("removes a branch's variables with the branch", async () => {
    await register("doomed", "main");
    await register("doomed", "staging");
    await put("doomed", "staging", { GONE: "soon" });
    await client.deleteApp({ caller: acme, appName: "doomed", branch: "staging" });
    const left = await service.ctx.read((em) => em.getConnection().execute("select count(*)::int as n from variables v left join apps a on a.id = v.app_id where a.id is null"));
    expect(left[0]!.n).toBe(0);
    const sets = await service.ctx.read((em) => em.getConnection().execute("select count(*)::int as n from variable_sets s left join apps a on a.id = s.app_id where a.id is null"));
    expect(sets[0]!.n).toBe(0);
    expect(await service.ctx.read((em) => em.count(Variable, {}))).toBeGreaterThan(0);
  });
});
