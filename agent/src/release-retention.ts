/**
 * Release retention. Each deploy unpacks its tag under `releases/<group>/<app>/<branch>/<tag>`
 * (a build with auto-deploy leaves its output there too), and nothing else ever removed one: a
 * busy branch filled the host's disk one release at a time. A release is a cache of its image (a
 * deploy of a tag whose release is gone unpacks the image again), so after each deploy its branch
 * keeps the releases replicas run from and the RELEASES_KEPT newest, for a quick roll back.
 */
import { readdir, rm, stat } from "node:fs/promises";
import path from "node:path";

export const RELEASES_KEPT = 3;

/** A release being unpacked (`<dir>.unpack-<pid>`) is not a release yet. */
const UNPACKING = /\.unpack-\d+$/;

/**
 * Removes the releases under `branchDir` but those in `inUse` (absolute paths) and the `keep`
 * newest (by when they were written or moved into place). Returns the names removed.
 */
export async function pruneReleases(branchDir: string, inUse: ReadonlySet<string>, keep = RELEASES_KEPT): Promise<string[]> {
  const entries = await readdir(branchDir, { withFileTypes: true }).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return [];
    throw err;
  });
  const releases: Array<{ name: string; dir: string; at: number }> = [];
  for (const e of entries) {
    if (!e.isDirectory() || UNPACKING.test(e.name)) continue;
    const dir = path.resolve(branchDir, e.name);
    const s = await stat(dir).catch(() => null);
    if (s) releases.push({ name: e.name, dir, at: Math.max(s.mtimeMs, s.ctimeMs) });
  }
  releases.sort((a, b) => b.at - a.at);
  const removed: string[] = [];
  for (const r of releases.slice(keep)) {
    if (inUse.has(r.dir)) continue;
    await rm(r.dir, { recursive: true, force: true });
    removed.push(r.name);
  }
  return removed;
}
