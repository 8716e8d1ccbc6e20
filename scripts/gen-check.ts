/**
 * `npm run gen:check`: the generated code (libs/proto/src/gen) is committed, so it must be what
 * `npm run gen` makes of proto/. Runs the generator and fails, listing the files, when it changed
 * anything under libs/proto or proto.
 *
 * Files are compared by content before and after generating, so uncommitted work in progress
 * (a .proto edited and regenerated, not yet committed) passes as long as it is consistent.
 * `--strict` (or GEN_CHECK_STRICT=1, for CI on a clean checkout) also fails when
 * `git status --porcelain libs/proto proto` shows anything at all after generating.
 */
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../", import.meta.url));
const watched = ["libs/proto", "proto"];
const strict = process.argv.includes("--strict") || ["1", "true"].includes(process.env.GEN_CHECK_STRICT ?? "");

function snapshot(): Map<string, string> {
  const files = new Map<string, string>();
  const walk = (dir: string) => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (e.name === "node_modules" || e.name === ".git") continue;
      const full = path.join(dir, e.name);
      if (e.isDirectory()) walk(full);
      else if (e.isFile()) files.set(path.relative(root, full), createHash("sha256").update(fs.readFileSync(full)).digest("hex"));
    }
  };
  for (const w of watched) walk(path.join(root, w));
  return files;
}

function gitStatus(): string | undefined {
  const r = spawnSync("git", ["status", "--porcelain", "--", ...watched], { cwd: root, encoding: "utf8" });
  return r.status === 0 ? r.stdout.trimEnd() : undefined;
}

const before = snapshot();
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const gen = spawnSync(npm, ["run", "--silent", "gen"], { cwd: root, stdio: "inherit" });
if (gen.status !== 0) {
  process.stderr.write(`gen-check: \`npm run gen\` failed (${gen.error?.message ?? `exit code ${gen.status}`})\n`);
  process.exit(1);
}
const after = snapshot();

const changed: string[] = [];
for (const [file, hash] of after) {
  if (!before.has(file)) changed.push(`added     ${file}`);
  else if (before.get(file) !== hash) changed.push(`modified  ${file}`);
}
for (const file of before.keys()) if (!after.has(file)) changed.push(`deleted   ${file}`);

if (changed.length > 0) {
  process.stderr.write("gen-check: the generated code was out of date with proto/; `npm run gen` changed:\n");
  for (const line of changed.sort()) process.stderr.write(`  ${line}\n`);
  const status = gitStatus();
  if (status) process.stderr.write(`git status --porcelain ${watched.join(" ")}:\n${status}\n`);
  process.stderr.write("Commit the regenerated files.\n");
  process.exit(1);
}
if (strict) {
  const status = gitStatus();
  if (status === undefined) {
    process.stderr.write("gen-check --strict: git status failed (is this a git checkout with git installed?)\n");
    process.exit(1);
  }
  if (status) {
    process.stderr.write(`gen-check --strict: uncommitted changes under ${watched.join(", ")}:\n${status}\n`);
    process.exit(1);
  }
}
process.stdout.write("gen-check: generated code is up to date\n");
