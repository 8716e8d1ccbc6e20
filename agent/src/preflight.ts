/**
 * GIT_PREFLIGHT (spec doc 1 sections 2.1 and 3.3; ARCHITECTURE sections 4, 5 and 8): before an
 * app may build, an agent tries its repository with real git and answers one of
 *
 * - `no_access`: the repository cannot be read (unsupported URL, refused, unreachable, timed out)
 *   or the branch does not exist;
 * - `needs_config`: the branch has no app config file at `config_path`;
 * - `config_invalid`: the config file breaks the schema of @platform/app-config (or `config_path`
 *   itself escapes the repository);
 * - `ready`: the config is valid; `services` names its services.
 *
 * It is a fast agent RPC (NATS request/reply, never the deploy lane): every agent answers on
 * `agent.rpc.<host_id>.git_preflight` and, in the queue group `agents`, on
 * `agent.rpc.any.git_preflight`, so exactly one agent answers a request for "any agent".
 *
 * Reading the config costs one shallow, single-branch, blob-less clone without a checkout in a
 * temporary directory under AGENT_WORK_DIR: the file is read from the commit's tree, so nothing
 * of the repository is written to disk as files and a symbolic link cannot lead outside it.
 */
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, readdir, rm, stat } from "node:fs/promises";
import path from "node:path";
import { checkRepositoryUrl, MAX_CONFIG_BYTES, parseAppConfigYaml, type ConfigProblem } from "@platform/app-config";
import { answerWorking, subjects, type Bus, type Subscription } from "@platform/bus";
import type { Logger } from "@platform/logger";
import { extractTraceContext, withSpan, SpanKind } from "@platform/telemetry";
import { errorText } from "./error-text.ts";

/** The op token of the subjects: `agent.rpc.<host_id>.git_preflight`, `agent.rpc.any.git_preflight`. */
export const GIT_PREFLIGHT_OP = "git_preflight";
/** Queue group of the "any agent" subjects: one member answers each request. */
export const AGENTS_QUEUE_GROUP = "agents";
/** Budget of all the git commands of one preflight. Requesters wait longer than this. */
export const GIT_TIMEOUT_MS = 30_000;
export const DEFAULT_CONFIG_PATH = "platform.yaml";
/** Preflights one agent runs at once; further requests wait their turn. */
export const MAX_CONCURRENT_PREFLIGHTS = 4;
/** Symbolic links followed from `config_path` before giving up. */
const MAX_SYMLINK_HOPS = 8;
const MAX_CONFIG_PATH_LENGTH = 512;
const MAX_BRANCH_LENGTH = 255;

export interface GitPreflightRequest {
  repository: string;
  branch: string;
  /** Path of the app config file in the repository; default `platform.yaml`. */
  config_path?: string;
}

export type PreflightStatus = "no_access" | "needs_config" | "config_invalid" | "ready";

/**
 * Why, in one stable word. `no_access`: invalid_request, repository_unsupported,
 * file_repository_not_allowed, branch_invalid, repository_unreachable, branch_not_found, timeout,
 * agent_error (the agent itself failed: transient, worth asking again). `needs_config`:
 * config_missing. `config_invalid`: config_path_invalid, config_invalid. `ready`: ready.
 */
export type PreflightReason =
  | "invalid_request"
  | "repository_unsupported"
  | "file_repository_not_allowed"
  | "branch_invalid"
  | "repository_unreachable"
  | "branch_not_found"
  | "timeout"
  | "agent_error"
  | "config_missing"
  | "config_path_invalid"
  | "config_invalid"
  | "ready";

/** The app row's `preflight_result` (spec doc 1 section 2.1): every key is always present. */
export interface PreflightResult {
  reason: PreflightReason;
  /** One sentence for a person. */
  detail: string;
  /** Service names of a valid config (empty otherwise). */
  services: string[];
  /** `[config_path]` when the config file is missing (empty otherwise). */
  missing_paths: string[];
  /** The config's problems when it is invalid (empty otherwise). */
  errors: ConfigProblem[];
}

export interface GitPreflightReply {
  status: PreflightStatus;
  result: PreflightResult | null;
  /** The valid config as authored (status ready only): apps-builds' base layer until a build. */
  config?: Record<string, unknown>;
  /** The commit of the branch that was read (absent when it could not be read). */
  commit?: string;
}

export interface PreflightDeps {
  /** AGENT_WORK_DIR (absolute): temporary clones go under `<workDir>/preflight/`. */
  workDir: string;
  /** PLATFORM_ALLOW_FILE_REPOS (default: true in the dev environment). */
  allowFileRepos: boolean;
  /** Budget of all git commands of one preflight (default 30 s). */
  timeoutMs?: number;
  /** Base environment of git (default `process.env`). */
  env?: NodeJS.ProcessEnv;
}

function reply(status: PreflightStatus, reason: PreflightReason, detail: string, extra: Partial<PreflightResult> = {}, commit?: string): GitPreflightReply {
  return {
    status,
    result: { reason, detail, services: [], missing_paths: [], errors: [], ...extra },
    ...(commit ? { commit } : {}),
  };
}

/** The answer when the agent itself failed: the requester gets an answer instead of a timeout. */
export function agentErrorReply(err: unknown): GitPreflightReply {
  const message = errorText(err);
  return reply("no_access", "agent_error", `The agent could not run the preflight: ${message}`);
}

// ---------------------------------------------------------------------------------------------
// Checks of the request (no I/O)

/** The request as sent, or why it is not one. `config_path` absent, null or empty means the default. */
export function parseGitPreflightRequest(value: unknown): { ok: true; request: Required<GitPreflightRequest> } | { ok: false; detail: string } {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { ok: false, detail: "The request must be a JSON object {repository, branch, config_path}." };
  }
  const v = value as Record<string, unknown>;
  if (typeof v.repository !== "string" || v.repository === "") return { ok: false, detail: "repository must be a non-empty string." };
  if (typeof v.branch !== "string" || v.branch === "") return { ok: false, detail: "branch must be a non-empty string." };
  if (v.config_path !== undefined && v.config_path !== null && typeof v.config_path !== "string") {
    return { ok: false, detail: "config_path must be a string." };
  }
  const configPath = typeof v.config_path === "string" && v.config_path !== "" ? v.config_path : DEFAULT_CONFIG_PATH;
  return { ok: true, request: { repository: v.repository, branch: v.branch, config_path: configPath } };
}

/**
 * `config_path` as a clean path relative to the repository root, or why it is refused: absolute
 * paths and `..` segments could name a file outside the repository.
 */
export function checkConfigPath(configPath: string): { ok: true; path: string } | { ok: false; detail: string } {
  const shown = JSON.stringify(configPath.length > 80 ? `${configPath.slice(0, 77)}...` : configPath);
  if (configPath.length > MAX_CONFIG_PATH_LENGTH) return { ok: false, detail: `config_path is longer than ${MAX_CONFIG_PATH_LENGTH} characters.` };
  if (/[\x00-\x1f\x7f]/.test(configPath)) return { ok: false, detail: `config_path ${shown} contains control characters.` };
  if (configPath.startsWith("/") || configPath.startsWith("\\") || /^[A-Za-z]:/.test(configPath)) {
    return { ok: false, detail: `config_path ${shown} is absolute; it must be a path inside the repository, such as platform.yaml.` };
  }
  const segments = configPath.split(/[/\\]/);
  if (segments.includes("..")) {
    return { ok: false, detail: `config_path ${shown} leaves the repository (".."); it must be a path inside it, such as platform.yaml.` };
  }
  const clean = configPath.split("/").filter((s) => s !== "" && s !== ".");
  if (clean.length === 0) return { ok: false, detail: `config_path ${shown} names no file.` };
  return { ok: true, path: clean.join("/") };
}

// ---------------------------------------------------------------------------------------------
// Running git

/** Environment of every git command: never prompts, never waits for a person. */
export function gitEnv(base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  return {
    ...base,
    GIT_TERMINAL_PROMPT: "0",
    GIT_ASKPASS: "/bin/true",
    SSH_ASKPASS: "/bin/true",
    GCM_INTERACTIVE: "never",
    GIT_SSH_COMMAND: `${base.GIT_SSH_COMMAND || "ssh"} -o BatchMode=yes`,
    GIT_LITERAL_PATHSPECS: "1",
    GIT_LFS_SKIP_SMUDGE: "1",
    LC_ALL: "C",
  };
}

/** `-c` options allowing only the transports of accepted URLs (also for redirects and lazy fetches). */
export function gitProtocolConfig(allowFileRepos: boolean): string[] {
  const allowed = ["https", "http", "ssh", ...(allowFileRepos ? ["file"] : [])];
  return ["-c", "protocol.allow=never", ...allowed.flatMap((p) => ["-c", `protocol.${p}.allow=always`])];
}

export interface GitResult {
  code: number | null;
  stdout: Buffer;
  stderr: string;
  timedOut: boolean;
  /** stdout reached `maxStdoutBytes`; git was stopped and `stdout` holds the first bytes. */
  truncated: boolean;
}

export interface GitRunOptions {
  env: NodeJS.ProcessEnv;
  cwd?: string;
  /** Epoch milliseconds after which git (and whatever it started) is killed. */
  deadline: number;
  maxStdoutBytes?: number;
}

/** Runs git (no shell) in its own process group, killed with its helpers at the deadline. */
export function runGit(args: string[], opts: GitRunOptions): Promise<GitResult> {
  const remaining = opts.deadline - Date.now();
  if (remaining <= 0) return Promise.resolve({ code: null, stdout: Buffer.alloc(0), stderr: "", timedOut: true, truncated: false });
  const maxStdout = opts.maxStdoutBytes ?? 16 * 1024 * 1024;
  return new Promise((resolve, reject) => {
    const child = spawn("git", args, { cwd: opts.cwd, env: opts.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const out: Buffer[] = [];
    let outBytes = 0;
    let stderr = "";
    let timedOut = false;
    let truncated = false;
    const killGroup = () => {
      try {
        if (child.pid) process.kill(-child.pid, "SIGKILL");
      } catch {
        child.kill("SIGKILL");
      }
    };
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, remaining);
    child.stdout.on("data", (chunk: Buffer) => {
      if (truncated) return;
      const room = maxStdout - outBytes;
      if (chunk.length >= room) {
        out.push(chunk.subarray(0, room));
        outBytes += room;
        truncated = true;
        killGroup();
        return;
      }
      out.push(chunk);
      outBytes += chunk.length;
    });
    child.stderr.on("data", (chunk: Buffer) => {
      if (stderr.length < 64 * 1024) stderr += chunk.toString("utf8");
    });
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout: Buffer.concat(out), stderr, timedOut: timedOut && !truncated, truncated });
    });
  });
}

/** git's complaint in one short, credential-free line. */
export function gitFailureDetail(stderr: string): string {
  const boilerplate = /^(hint:|warning: filtering not recognized|Please make sure you have the correct access rights|and the repository exists\.)/;
  const lines = stderr
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !boilerplate.test(l));
  const text = lines.slice(-4).join(" ") || "git failed without saying why";
  const redacted = text.replace(/([a-z][a-z0-9+.-]*:\/\/)[^/@\s]+@/gi, "$1***@");
  return redacted.length > 500 ? `${redacted.slice(0, 497)}...` : redacted;
}

// ---------------------------------------------------------------------------------------------
// The preflight

interface GitContext {
  env: NodeJS.ProcessEnv;
  protocol: string[];
  deadline: number;
  timeoutMs: number;
}

function timeoutReply(ctx: GitContext, step: string, commit?: string): GitPreflightReply {
  return reply("no_access", "timeout", `git did not finish ${step} within ${Math.round(ctx.timeoutMs / 1000)} s.`, {}, commit);
}

/** The branch is a valid branch name (git's own rules). */
async function branchNameValid(branch: string, ctx: GitContext): Promise<boolean | "timeout"> {
  if (branch.length > MAX_BRANCH_LENGTH || branch.startsWith("-")) return false;
  const r = await runGit(["check-ref-format", `refs/heads/${branch}`], { env: ctx.env, deadline: ctx.deadline });
  if (r.timedOut) return "timeout";
  return r.code === 0;
}

type TreeEntry = { kind: "missing" } | { kind: "blob"; mode: string; oid: string } | { kind: "tree" } | { kind: "commit" };

async function treeEntry(clone: string, file: string, ctx: GitContext): Promise<TreeEntry | "timeout"> {
  const r = await runGit([...ctx.protocol, "ls-tree", "-z", "HEAD", "--", file], { env: ctx.env, cwd: clone, deadline: ctx.deadline });
  if (r.timedOut) return "timeout";
  if (r.code !== 0) throw new Error(`git ls-tree failed: ${gitFailureDetail(r.stderr)}`);
  for (const record of r.stdout.toString("utf8").split("\0")) {
    const tab = record.indexOf("\t");
    if (tab < 0 || record.slice(tab + 1) !== file) continue;
    const [mode = "", type = "", oid = ""] = record.slice(0, tab).split(" ");
    if (type === "blob") return { kind: "blob", mode, oid };
    if (type === "tree") return { kind: "tree" };
    if (type === "commit") return { kind: "commit" };
  }
  return { kind: "missing" };
}

async function readBlob(clone: string, oid: string, maxBytes: number, ctx: GitContext): Promise<Buffer | "timeout"> {
  const r = await runGit([...ctx.protocol, "cat-file", "blob", oid], { env: ctx.env, cwd: clone, deadline: ctx.deadline, maxStdoutBytes: maxBytes });
  if (r.timedOut) return "timeout";
  if (r.code !== 0 && !r.truncated) throw new Error(`git cat-file failed: ${gitFailureDetail(r.stderr)}`);
  return r.stdout;
}

/**
 * The config file's bytes at HEAD of the clone, following symbolic links that stay inside the
 * repository; or what is wrong with it.
 */
async function readConfigFile(
  clone: string,
  configPath: string,
  ctx: GitContext,
): Promise<{ kind: "file"; text: string } | { kind: "missing"; detail: string } | { kind: "escapes"; detail: string } | "timeout"> {
  let current = configPath;
  for (let hop = 0; hop <= MAX_SYMLINK_HOPS; hop++) {
    const entry = await treeEntry(clone, current, ctx);
    if (entry === "timeout") return "timeout";
    const via = current === configPath ? "" : ` (via the symbolic link ${configPath})`;
    switch (entry.kind) {
      case "missing":
        return { kind: "missing", detail: `The branch has no ${current}${via}.` };
      case "tree":
        return { kind: "missing", detail: `${current}${via} is a directory, not a config file.` };
      case "commit":
        return { kind: "missing", detail: `${current}${via} is a git submodule, not a config file.` };
      case "blob": {
        if (entry.mode !== "120000") {
          // One byte past the bound is enough for the parser to refuse the file as too large.
          const bytes = await readBlob(clone, entry.oid, MAX_CONFIG_BYTES + 1, ctx);
          if (bytes === "timeout") return "timeout";
          return { kind: "file", text: new TextDecoder("utf-8").decode(bytes) };
        }
        const target = await readBlob(clone, entry.oid, MAX_CONFIG_PATH_LENGTH + 1, ctx);
        if (target === "timeout") return "timeout";
        const link = target.toString("utf8");
        const next = path.posix.normalize(path.posix.join(path.posix.dirname(current), link));
        if (link.startsWith("/") || next === ".." || next.startsWith("../")) {
          return { kind: "escapes", detail: `${current} is a symbolic link to ${JSON.stringify(link)}, outside the repository.` };
        }
        current = next;
        break;
      }
    }
  }
  return { kind: "escapes", detail: `${configPath} goes through more than ${MAX_SYMLINK_HOPS} symbolic links.` };
}

/**
 * One preflight: checks the request, asks the remote for the branch (`git ls-remote`), clones its
 * HEAD shallowly into a temporary directory (removed afterwards), and reads and validates the
 * config file there. Never throws for a problem of the repository; throws only if the agent
 * itself fails (no git, no disk), which the RPC layer answers as `agent_error`.
 */
export async function gitPreflight(value: unknown, deps: PreflightDeps): Promise<GitPreflightReply> {
  const parsed = parseGitPreflightRequest(value);
  if (!parsed.ok) return reply("no_access", "invalid_request", parsed.detail);
  const { repository, branch, config_path } = parsed.request;

  const repo = checkRepositoryUrl(repository, deps.allowFileRepos);
  if (!repo.ok) return reply("no_access", repo.reason, repo.detail);

  const timeoutMs = deps.timeoutMs ?? GIT_TIMEOUT_MS;
  const ctx: GitContext = {
    env: gitEnv(deps.env),
    protocol: gitProtocolConfig(deps.allowFileRepos),
    deadline: Date.now() + timeoutMs,
    timeoutMs,
  };

  const branchValid = await branchNameValid(branch, ctx);
  if (branchValid === "timeout") return timeoutReply(ctx, "checking the branch name");
  if (!branchValid) return reply("no_access", "branch_invalid", `${JSON.stringify(branch)} is not a valid branch name.`);

  const configPath = checkConfigPath(config_path);
  if (!configPath.ok) return reply("config_invalid", "config_path_invalid", configPath.detail);

  // Access and the branch, without downloading anything.
  const ref = `refs/heads/${branch}`;
  const ls = await runGit([...ctx.protocol, "ls-remote", "--heads", repository, ref], { env: ctx.env, deadline: ctx.deadline });
  if (ls.timedOut) return timeoutReply(ctx, "reading the repository");
  if (ls.code !== 0) {
    return reply("no_access", "repository_unreachable", `The repository cannot be read: ${gitFailureDetail(ls.stderr)}`);
  }
  const advertised = ls.stdout
    .toString("utf8")
    .split("\n")
    .map((line) => line.split("\t"))
    .find(([, name]) => name === ref);
  if (!advertised) return reply("no_access", "branch_not_found", `The repository has no branch ${JSON.stringify(branch)}.`);

  const root = path.join(deps.workDir, "preflight");
  await mkdir(root, { recursive: true });
  const clone = await mkdtemp(path.join(root, "clone-"));
  try {
    const cloned = await runGit(
      [
        ...ctx.protocol,
        "clone",
        "--quiet",
        "--depth",
        "1",
        "--single-branch",
        `--branch=${branch}`,
        "--no-checkout",
        "--no-tags",
        "--filter=blob:none",
        "--",
        repository,
        clone,
      ],
      { env: ctx.env, deadline: ctx.deadline },
    );
    if (cloned.timedOut) return timeoutReply(ctx, "cloning the branch");
    if (cloned.code !== 0) {
      const detail = gitFailureDetail(cloned.stderr);
      if (/Remote branch .* not found/i.test(detail)) {
        return reply("no_access", "branch_not_found", `The repository has no branch ${JSON.stringify(branch)}.`);
      }
      return reply("no_access", "repository_unreachable", `The branch cannot be cloned: ${detail}`);
    }
    const head = await runGit(["rev-parse", "--verify", "HEAD^{commit}"], { env: ctx.env, cwd: clone, deadline: ctx.deadline });
    if (head.timedOut) return timeoutReply(ctx, "reading the commit");
    if (head.code !== 0) throw new Error(`git rev-parse failed: ${gitFailureDetail(head.stderr)}`);
    const commit = head.stdout.toString("utf8").trim();

    const file = await readConfigFile(clone, configPath.path, ctx);
    if (file === "timeout") return timeoutReply(ctx, "reading the config file", commit);
    if (file.kind === "escapes") return reply("config_invalid", "config_path_invalid", file.detail, {}, commit);
    if (file.kind === "missing") {
      return reply("needs_config", "config_missing", file.detail, { missing_paths: [config_path] }, commit);
    }

    const config = parseAppConfigYaml(file.text);
    if (!config.ok) {
      const n = config.errors.length;
      return reply("config_invalid", "config_invalid", `${configPath.path} has ${n} problem${n === 1 ? "" : "s"}.`, { errors: config.errors }, commit);
    }
    const services = Object.keys(config.config.services ?? {});
    return {
      ...reply(
        "ready",
        "ready",
        `${configPath.path} at ${commit.slice(0, 12)} is valid (${services.length} service${services.length === 1 ? "" : "s"}).`,
        { services },
        commit,
      ),
      config: config.config as Record<string, unknown>,
    };
  } finally {
    await rm(clone, { recursive: true, force: true });
  }
}

/**
 * Removes temporary clones older than `olderThanMs` left by an agent that died mid-preflight.
 * Young ones may belong to another agent sharing the work directory.
 */
export async function sweepPreflightClones(workDir: string, olderThanMs = 10 * 60_000): Promise<number> {
  const root = path.join(workDir, "preflight");
  let names: string[];
  try {
    names = await readdir(root);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const name of names) {
    if (!name.startsWith("clone-")) continue;
    const dir = path.join(root, name);
    try {
      if (Date.now() - (await stat(dir)).mtimeMs < olderThanMs) continue;
      await rm(dir, { recursive: true, force: true });
      removed += 1;
    } catch {
      // Gone already.
    }
  }
  return removed;
}

// ---------------------------------------------------------------------------------------------
// The RPC

/** A core NATS message, as a subscription yields it. */
type Msg = Subscription extends AsyncIterable<infer M> ? M : never;

export interface GitPreflightServerOptions {
  bus: Bus;
  hostId: string;
  deps: PreflightDeps;
  logger: Logger;
  maxConcurrent?: number;
}

export interface GitPreflightServer {
  /** The subjects answered (with the bus prefix). */
  subjects: string[];
  /** Stops taking requests and waits for the ones in flight to be answered. */
  stop(): Promise<void>;
}

function limiter(max: number) {
  let active = 0;
  const waiting: Array<() => void> = [];
  return async <T>(fn: () => Promise<T>): Promise<T> => {
    while (active >= max) await new Promise<void>((resolve) => waiting.push(resolve));
    active += 1;
    try {
      return await fn();
    } finally {
      active -= 1;
      waiting.shift()?.();
    }
  };
}

function decodeRequest(msg: Msg): unknown {
  try {
    return msg.json<unknown>();
  } catch {
    return undefined;
  }
}

/**
 * Answers GIT_PREFLIGHT on this host's subject and, in the queue group `agents`, on the "any
 * agent" subject. Every request gets an answer: a failure of the agent itself is answered as
 * `no_access` with reason `agent_error` rather than leaving the requester to time out.
 */
export function serveGitPreflight(opts: GitPreflightServerOptions): GitPreflightServer {
  const { bus, logger } = opts;
  const limit = limiter(opts.maxConcurrent ?? MAX_CONCURRENT_PREFLIGHTS);
  const inFlight = new Set<Promise<void>>();

  const answer = async (msg: Msg): Promise<void> => {
    const parent = extractTraceContext({ set: () => undefined, get: (k) => msg.headers?.get(k) ?? "" });
    let result: GitPreflightReply;
    try {
      result = await withSpan(
        "agent.rpc git_preflight",
        { kind: SpanKind.SERVER, parent, attributes: { "messaging.system": "nats", "messaging.destination.name": msg.subject } },
        // Waiting for a slot counts as working: the requester hears the agent is alive.
        () => answerWorking(msg, () => limit(() => gitPreflight(decodeRequest(msg), opts.deps))),
      );
    } catch (err) {
      logger.error({ err, subject: msg.subject }, "git preflight failed in the agent");
      result = agentErrorReply(err);
    }
    if (result.result && result.result.reason !== "ready") {
      logger.info({ status: result.status, reason: result.result.reason }, "git preflight answered");
    }
    if (!msg.reply) return;
    try {
      msg.respond(JSON.stringify(result));
    } catch (err) {
      logger.warn({ err, subject: msg.subject }, "could not answer a git preflight");
    }
  };

  const names = [bus.subject(subjects.agentRpc(opts.hostId, GIT_PREFLIGHT_OP)), bus.subject(subjects.agentRpcAny(GIT_PREFLIGHT_OP))];
  const subs: Subscription[] = names.map((name) => bus.nc.subscribe(name, { queue: AGENTS_QUEUE_GROUP }));
  const loops = subs.map(async (sub) => {
    for await (const msg of sub) {
      const p = answer(msg).finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
  });

  void sweepPreflightClones(opts.deps.workDir)
    .then((n) => n > 0 && logger.info({ removed: n }, "removed stale preflight clones"))
    .catch((err: unknown) => logger.warn({ err }, "could not sweep stale preflight clones"));

  return {
    subjects: names,
    async stop() {
      await Promise.all(subs.map((sub) => sub.drain().catch(() => sub.unsubscribe())));
      await Promise.all(loops);
      await Promise.allSettled([...inFlight]);
    },
  };
}
