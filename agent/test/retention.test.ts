/**
 * Host retention on a real directory tree: a branch keeps the releases replicas run from and the
 * newest few, an app the images of the tags that run and the newest few; a release being
 * unpacked, an image being written and a directory not there yet are left alone.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { pruneImages, pruneReleases } from "../src/retention.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let root: string;

beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "agent-retention-"));
});

afterAll(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

/** Releases written oldest first, a little apart. */
async function branchWith(name: string, tags: string[]): Promise<string> {
  const dir = path.join(root, name);
  for (const tag of tags) {
    await mkdir(path.join(dir, tag, "dist"), { recursive: true });
    await writeFile(path.join(dir, tag, "dist", "server.js"), tag);
    await sleep(20);
  }
  return dir;
}

it("keeps the newest releases and those replicas run from; removes the rest", async () => {
  const dir = await branchWith("main", ["main-00000001", "main-00000002", "main-00000003", "main-00000004", "main-00000005", "main-00000006"]);
  const removed = await pruneReleases(dir, new Set([path.join(dir, "main-00000002")]), 3);
  expect(removed.sort()).toEqual(["main-00000001", "main-00000003"]);
  expect((await readdir(dir)).sort()).toEqual(["main-00000002", "main-00000004", "main-00000005", "main-00000006"]);
});

it("leaves a release being unpacked, and a branch with no releases yet", async () => {
  const dir = await branchWith("unpacking", ["main-0000000a", "main-0000000b"]);
  await mkdir(path.join(dir, "main-0000000c.unpack-4242"));
  expect(await pruneReleases(dir, new Set(), 1)).toEqual(["main-0000000a"]);
  expect((await readdir(dir)).sort()).toEqual(["main-0000000b", "main-0000000c.unpack-4242"]);
  expect(await pruneReleases(path.join(root, "never-deployed"), new Set())).toEqual([]);
});

it("keeps an app's newest images and those of the tags that run; leaves an archive being written", async () => {
  const dir = path.join(root, "images", "node-web");
  await mkdir(dir, { recursive: true });
  for (const tag of ["main-00000001", "main-00000002", "main-00000003", "main-00000004"]) {
    await writeFile(path.join(dir, `${tag}.tar.gz`), tag);
    await sleep(20);
  }
  await writeFile(path.join(dir, "main-00000005.tar.gz.4242.partial"), "half");
  expect((await pruneImages(dir, new Set(["main-00000001"]), 2)).sort()).toEqual(["main-00000002"]);
  expect((await readdir(dir)).sort()).toEqual(["main-00000001.tar.gz", "main-00000003.tar.gz", "main-00000004.tar.gz", "main-00000005.tar.gz.4242.partial"]);
  expect(await pruneImages(path.join(root, "images", "never-built"), new Set())).toEqual([]);
});
