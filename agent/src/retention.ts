/**
 * What a host keeps on disk of the apps it built and deployed. Nothing but an undeploy with
 * purge ever removed a release or an image, and a busy app filled the host's disk one build at
 * a time. Both are caches:
 * - a release (`releases/<group>/<app>/<branch>/<tag>`, the image unpacked, or a build's output
 *   kept for its auto-deploy) is unpacked again from the image by a deploy that lacks it;
 * - a host's image (`<imageDir>/<app>/<tag>.tar.gz`) is fetched again from the fleet's image
 *   store (kept there 30 days) by a deploy that lacks it.
 * So after each deploy a branch keeps the releases replicas run from and the RELEASES_KEPT
 * newest, and the app keeps the images of the tags that run here and the IMAGES_KEPT newest.
 */
import { readdir, rm, stat } from "node:fs/promises";
import path from "node:path";

export const RELEASES_KEPT = 3;
export const IMAGES_KEPT = 10;

/** A release being unpacked (`<dir>.unpack-<pid>`) is not a release yet. */
const UNPACKING = /\.unpack-\d+$/;
const IMAGE = /^(.+)\.tar\.gz$/;

interface Entry {
  name: string;
  file: string;
  at: number;
}

async function entries(dir: string, take: (e: { name: string; isDirectory(): boolean; isFile(): boolean }) => boolean): Promise<Entry[]> {
  const found = await readdir(dir, { withFileTypes: true }).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return [];
    throw err;
  });
  const out: Entry[] = [];
  for (const e of found) {
    if (!take(e)) continue;
    const file = path.resolve(dir, e.name);
    // When it was written or moved into place (a rename changes ctime, not mtime).
    const s = await stat(file).catch(() => null);
    if (s) out.push({ name: e.name, file, at: Math.max(s.mtimeMs, s.ctimeMs) });
  }
  return out.sort((a, b) => b.at - a.at);
}

async function removeAllBut(found: Entry[], keep: number, kept: (e: Entry) => boolean): Promise<string[]> {
  const removed: string[] = [];
  for (const e of found.slice(keep)) {
    if (kept(e)) continue;
    await rm(e.file, { recursive: true, force: true });
    removed.push(e.name);
  }
  return removed;
}

/** Removes the releases under `branchDir` but those in `inUse` (absolute paths) and the `keep` newest; returns the tags removed. */
export async function pruneReleases(branchDir: string, inUse: ReadonlySet<string>, keep = RELEASES_KEPT): Promise<string[]> {
  const found = await entries(branchDir, (e) => e.isDirectory() && !UNPACKING.test(e.name));
  return removeAllBut(found, keep, (e) => inUse.has(e.file));
}

/** Removes the images under `appImageDir` but those of the tags in `inUse` and the `keep` newest; returns the tags removed. */
export async function pruneImages(appImageDir: string, inUse: ReadonlySet<string>, keep = IMAGES_KEPT): Promise<string[]> {
  // Only finished archives: a `.partial` one is being written by a build.
  const found = await entries(appImageDir, (e) => e.isFile() && IMAGE.test(e.name));
  const tag = (e: Entry) => IMAGE.exec(e.name)![1]!;
  return (await removeAllBut(found, keep, (e) => inUse.has(tag(e)))).map((name) => IMAGE.exec(name)![1]!);
}
