/** Small helpers for running the machine's own programs (initdb, pg_ctl, apt-get). */
import { spawn, type SpawnOptions } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

export interface RunOptions {
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** Show the program's output on our own stdout/stderr instead of capturing it. */
  inherit?: boolean;
  /** Start it in its own process group, out of reach of the terminal's Ctrl-C. */
  detached?: boolean;
}

/** Runs a program to completion; never throws for a non-zero exit (check `code`). */
export function run(command: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const spawnOpts: SpawnOptions = {
      cwd: opts.cwd,
      env: opts.env ?? process.env,
      detached: opts.detached ?? false,
      stdio: opts.inherit ? ["ignore", "inherit", "inherit"] : ["ignore", "pipe", "pipe"],
    };
    const child = spawn(command, args, spawnOpts);
    let output = "";
    child.stdout?.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
    child.stderr?.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
    child.once("error", reject);
    child.once("close", (code, signal) => resolve({ code, signal, output }));
  });
}

/** Like `run`, but a non-zero exit is an error carrying the program's output. */
export async function runChecked(command: string, args: string[], opts: RunOptions = {}): Promise<string> {
  const result = await run(command, args, opts);
  if (result.code !== 0) {
    const how = result.signal ? `was killed by ${result.signal}` : `exited with code ${result.code}`;
    const tail = lastLines(result.output, 40);
    throw new Error(`${[command, ...args].join(" ")} ${how}${tail ? `:\n${tail}` : ""}`);
  }
  return result.output;
}

export function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

/** A program's full path from PATH (and any extra directories), or undefined. */
export function which(name: string, extraDirs: string[] = []): string | undefined {
  const dirs = [...(process.env.PATH ?? "").split(path.delimiter).filter(Boolean), ...extraDirs];
  for (const dir of dirs) {
    const candidate = path.join(dir, name);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

export function lastLines(text: string, n: number): string {
  const lines = text.replace(/\s+$/, "").split("\n");
  return lines.slice(-n).join("\n");
}

/** Quotes one argument for /bin/sh. */
export function shellQuote(arg: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`;
}

export function isRoot(): boolean {
  return typeof process.getuid === "function" && process.getuid() === 0;
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
