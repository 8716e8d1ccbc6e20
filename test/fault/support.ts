/**
 * What the fault tests share: a tenant `acme` with an admin key, the node-web fixture registered
 * with its preflight ready, and waiting for a build or a deployment to end. HTTP only, through
 * the e2e helpers.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { expect } from "vitest";
import type { TestFleet } from "@platform/testing";
import { makeFixtureRepo, type FixtureFiles, type FixtureRepo } from "../fixtures/git.ts";
import { call, waitFor } from "../e2e/support.ts";

export const APP = "node-web";
const TERMINAL = ["completed", "failed", "cancelled"];

export interface Tenant {
  api: string;
  key: string;
}

/** Group `acme` and an admin key of it. */
export async function acmeTenant(fleet: TestFleet): Promise<Tenant> {
  await call(fleet.api, "POST", "/groups", { credential: fleet.rootKey, body: { slug: "acme" } });
  const key = (await call(fleet.api, "POST", "/keys", { credential: fleet.rootKey, body: { name: "acme", scope: "admin", group: "acme" } })).body.key as string;
  return { api: fleet.api, key };
}

/** The node-web fixture (with `files` changed) registered as APP, its preflight ready; with its server.js as committed. */
export async function registeredWeb(t: Tenant, files?: FixtureFiles): Promise<{ repo: FixtureRepo; serverJs: string }> {
  const repo = await makeFixtureRepo("node-web", { files });
  const serverJs = await readFile(path.join(repo.dir, "server.js"), "utf8");
  expect((await call(t.api, "POST", "/apps", { credential: t.key, body: { app_name: APP, repository: repo.url } })).status).toBe(201);
  await waitFor(async () => (await call(t.api, "GET", `/apps/${APP}`, { credential: t.key })).body.preflight_status, (s) => s === "ready", 60_000);
  return { repo, serverJs };
}

export async function buildFinished(t: Tenant, buildId: string) {
  return waitFor(async () => (await call(t.api, "GET", `/builds/id/${buildId}`, { credential: t.key })).body, (b) => TERMINAL.includes(b.status), 120_000);
}

/** The deployment of `tag` once it has ended. */
export async function deployedTag(t: Tenant, tag: string) {
  const id = await waitFor(
    async () => (await call(t.api, "GET", `/deployments?app_name=${APP}`, { credential: t.key })).body.items?.find((d: any) => d.image_tag === tag)?.id as string | undefined,
    (i) => !!i,
    120_000,
  );
  return waitFor(async () => (await call(t.api, "GET", `/deployments/${id}`, { credential: t.key })).body, (d) => TERMINAL.includes(d.status), 120_000);
}
