/**
 * `npm test [-- vitest args]`: everything a change must pass, on a fresh machine too.
 *   1. Postgres and NATS JetStream answer (started under .data/ when they do not, as npm start does)
 *   2. npm run typecheck
 *   3. the generated code matches proto/ (scripts/gen-check.ts)
 *   4. vitest run over the whole repository (unit, integration, then end to end)
 * Every step runs even when an earlier one failed, so one run reports everything; the exit code
 * is non-zero when any failed, and vitest's summary is the last thing printed.
 */
import { spawn } from "node:child_process";
import path from "node:path";
import {
  DEFAULT_DATA_DIR,
  DEFAULT_DATABASE_URL,
  DEFAULT_NATS_URL,
  InfrastructureError,
  REPO_ROOT,
  ensureInfrastructure,
  type StartedInfrastructure,
} from "@platform/fleet";

const extraArgs = process.argv.slice(2);
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const say = (line: string) => process.stdout.write(`${line}\n`);
let interrupted = false;

function step(title: string): void {
  say(`\n=== ${title}`);
}

function runInherit(command: string, args: string[]): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd: REPO_ROOT, stdio: "inherit" });
    child.once("error", (err) => {
      process.stderr.write(`could not run ${command}: ${err.message}\n`);
      resolve(1);
    });
    child.once("exit", (code, signal) => resolve(code ?? (signal ? 1 : 0)));
  });
}

// Ctrl-C reaches the running step too (same process group); we only stop what we started after it.
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    interrupted = true;
  });
}

const env = {
  databaseUrl: process.env.DATABASE_URL || DEFAULT_DATABASE_URL,
  natsUrl: process.env.NATS_URL || DEFAULT_NATS_URL,
};

let infra: StartedInfrastructure | undefined;
const failures: string[] = [];
try {
  step("infrastructure (Postgres, NATS JetStream)");
  try {
    infra = await ensureInfrastructure({ ...env, dataDir: DEFAULT_DATA_DIR, log: (line) => say(`[infra] ${line}`) });
    say(infra.started.length > 0 ? `started ${infra.started.join(" and ")} under .data/` : "Postgres and NATS answer");
  } catch (err) {
    process.stderr.write(`${err instanceof InfrastructureError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  }

  if (!interrupted) {
    step("npm run typecheck");
    if ((await runInherit(npm, ["run", "--silent", "typecheck"])) !== 0) failures.push("typecheck");
    else say("typecheck: clean");
  }

  if (!interrupted) {
    step("generated code (npm run gen:check)");
    if ((await runInherit(process.execPath, [path.join(REPO_ROOT, "scripts", "gen-check.ts")])) !== 0) failures.push("gen-check");
  }

  if (!interrupted) {
    step(`vitest run${extraArgs.length > 0 ? ` ${extraArgs.join(" ")}` : ""}`);
    if (failures.length > 0) say(`(already failed: ${failures.join(", ")}; running the tests anyway)`);
    const vitest = path.join(REPO_ROOT, "node_modules", "vitest", "vitest.mjs");
    if ((await runInherit(process.execPath, [vitest, "run", ...extraArgs])) !== 0) failures.push("vitest");
  }
} finally {
  await infra?.stop();
}

if (interrupted) process.exit(130);
process.exit(failures.length > 0 ? 1 : 0);
