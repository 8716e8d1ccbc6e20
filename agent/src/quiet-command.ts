/**
 * Programs of the host the agent runs: where one is found (findOnPath), and a command run to its
 * end for its exit status alone (tar, chown, nft, a bubblewrap probe), of whose output only the
 * start of its stderr is kept, to say why it failed.
 */
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access } from "node:fs/promises";
import path from "node:path";

/** The PATH of a process whose environment has none. */
export const DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin";

/** The executable `name` in the first directory of `pathVar` (a PATH; the agent's own by default) that has it. */
export async function findOnPath(name: string, pathVar: string = process.env.PATH ?? DEFAULT_PATH): Promise<string | null> {
  for (const dir of pathVar.split(":")) {
    if (!path.isAbsolute(dir)) continue;
    const file = path.join(dir, name);
    if (await access(file, constants.X_OK).then(() => true, () => false)) return file;
  }
  return null;
}

/** A host tool (nft, slirp4netns, nsenter): on the agent's PATH, or in the system directories a service's PATH may lack. */
export function findHostTool(name: string): Promise<string | null> {
  return findOnPath(name, `${process.env.PATH ?? ""}:/usr/sbin:/usr/bin:/sbin:/bin`);
}

/** How much of a command's output is kept: a quiet command says little. */
const OUTPUT_KEPT = 2000;

export interface QuietOutcome {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The start of its stderr, trimmed. */
  stderr: string;
  /** The start of its stdout, trimmed; empty unless asked for (`stdout`). */
  stdout: string;
}

/**
 * Runs `file args` (with `input` on its stdin, in `cwd`, keeping the start of its stdout when
 * `stdout`); rejects only when it could not be started.
 */
export function runQuietly(file: string, args: string[], opts: { input?: string; timeoutMs?: number; cwd?: string; stdout?: boolean } = {}): Promise<QuietOutcome> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { cwd: opts.cwd, stdio: [opts.input === undefined ? "ignore" : "pipe", opts.stdout ? "pipe" : "ignore", "pipe"], timeout: opts.timeoutMs });
    let stderr = "";
    let stdout = "";
    child.stderr!.on("data", (chunk: Buffer) => {
      if (stderr.length < OUTPUT_KEPT) stderr += chunk.toString("utf8");
    });
    child.stdout?.on("data", (chunk: Buffer) => {
      if (stdout.length < OUTPUT_KEPT) stdout += chunk.toString("utf8");
    });
    child.once("error", reject);
    child.once("close", (code, signal) => resolve({ code, signal, stderr: stderr.trim(), stdout: stdout.trim() }));
    if (opts.input !== undefined) {
      // A command that exits before reading all of its input closes the pipe: its exit status says why.
      child.stdin!.on("error", () => undefined);
      child.stdin!.end(opts.input);
    }
  });
}

/** How a command that failed ended: `exit code 1`, or the signal that killed it. */
export function endedWith(outcome: QuietOutcome): string {
  return outcome.signal ?? `exit code ${outcome.code}`;
}
