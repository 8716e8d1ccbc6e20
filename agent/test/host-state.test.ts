/** The agent's record of what runs on its host (state.json), on the real file system. */
import { afterAll, expect, it } from "vitest";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { HostState, type DeployedApp } from "../src/host-state.ts";

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

const app = (name: string): DeployedApp => ({
  key: `g/${name}/main`,
  group: "g",
  app: name,
  branch: "main",
  tag: "main-1",
  colour: "blue",
  deploymentId: `d-${name}`,
  hosts: [`${name}.dev.localhost`],
  releaseDir: `/srv/${name}`,
  services: {},
  since: "2026-11-24T00:00:00.000Z",
});

it("fails only the write that could not be made: the next one writes the whole state again", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "agent-host-state-"));
  dirs.push(dir);
  const runDir = path.join(dir, "run");
  // A file where the run directory should be: the state cannot be written.
  await writeFile(runDir, "not a directory");
  const state = new HostState(runDir);
  await expect(state.setApp(app("one"))).rejects.toThrow();
  await rm(runDir);
  await state.setApp(app("two"));
  const reread = new HostState(runDir);
  await reread.load();
  expect(reread.apps().map((a) => a.app).sort()).toEqual(["one", "two"]);
});
