/**
 * BUILD on the agent (issue: apps and builds, item 6): a shallow clone of the branch HEAD, the
 * app config validated with the shared schema, each service's build command run in the
 * workspace with its output streamed as log lines, and the result kept in the host's image store
 * as an archive for tag `{branch}-{hash}` and published to the fleet's image store. Cancel is
 * honoured between phases; the whole build has a deadline.
 */
import { spawn, type ChildProcessByStdio } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, mkdir, mkdtemp, readdir, readFile, realpath, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { StringDecoder } from "node:string_decoder";
import type { Readable } from "node:stream";
import { checkRepositoryUrl, normalizeAppConfig, parseAppConfigYaml, problemText, problemsSummary } from "@platform/app-config";
import { pairSafeEnd } from "@platform/bus";
import type { AppOfLine } from "@platform/logship";
import { checkConfigPath, gitEnv, gitFailureDetail, gitProtocolConfig, runGit } from "./preflight.ts";
import { errorText } from "./error-text.ts";
import { DROPPED_NOTICE_MS, LogRateLimit } from "./log-rate-limit.ts";
import { DEFAULT_PATH, endedWith, runQuietly } from "./quiet-command.ts";
import type { OwnNetwork, Sandbox } from "./sandbox.ts";
import { createCpuCgroup, createMemoryCgroup, createPidsCgroup, inCgroups, oomKillCount, pidsLimitHits, removeCgroup, type CgroupParent } from "./cgroups.ts";

export interface BuildJob {
  action_id: string;
  build_id: string;
  app_name: string;
  branch: string;
  group_slug: string;
  repository: string;
  config_path: string;
  tag: string;
  /** A deploy of the build follows it (POST /api/builds with auto_deploy). */
  auto_deploy?: boolean;
}

export type LogLevel = "info" | "warning" | "error";

/** What a phase report may tell the queue besides the phase's name. */
export interface PhaseFacts {
  /** A BUILD's commit, known once the clone is done. */
  commit?: { hash: string; message: string; author: string; committed_at: string };
}

export interface BuildDeps {
  hostId: string;
  workDir: string;
  imageDir: string;
  allowFileRepos: boolean;
  timeoutMs: number;
  /** Base environment of git (default `process.env`), as for the preflight. */
  gitEnv?: NodeJS.ProcessEnv;
  /** One line of build output (also kept for the stored log). */
  log(line: { level: LogLevel; message: string; service_name?: string; phase: string }): void;
  /**
   * Null while `log` takes lines of the app built (`of`); else a promise of room. A build
   * command's output is not read meanwhile, so the command waits on its writes instead of its
   * lines being dropped.
   */
  logRoom?(of: AppOfLine): Promise<void> | null;
  /** Reports a phase (with what is learned by then); true means cancel was requested and the build must stop. */
  phase(name: string, opts?: { wait?: boolean } & PhaseFacts): Promise<boolean>;
  /** Puts the archive in the fleet's image store, where hosts that deploy the tag fetch it. */
  publishImage(app: string, tag: string, file: string): Promise<void>;
  /**
   * Where this host keeps the release of a build that a deploy follows: the built tree is moved
   * there, so a deploy on this host starts it without unpacking the image it was just packed into.
   */
  releaseDir?(job: BuildJob): string;
  /** Said first in the build's log, as a warning (the agent restarted during an earlier run, say). */
  notice?: string;
  /**
   * Where build commands run: the repository's code is the tenant's, so it writes only its checkout
   * and its HOME and sees neither the agent's files nor its processes. Unsandboxed when absent.
   */
  sandbox?: Sandbox;
  /**
   * Each build command's memory bound (its processes together, swap included): one that passes
   * it is OOM-killed and fails the build, instead of starving the host's replicas and the agent.
   * Unbounded when absent or when the host has no usable memory cgroup.
   */
  memory?: { limitMb: number; cgroup(): Promise<CgroupParent | null> };
  /**
   * Each build command's bound on processes and threads together: a fork past it fails (and
   * most likely the command with it), instead of a fork bomb exhausting the host's.
   * Unbounded when absent or when the host has no usable pids cgroup.
   */
  pids?: { max: number; cgroup(): Promise<CgroupParent | null> };
  /** Where each build command gets a cgroup weighing its processes together on the CPU (createCpuCgroup). */
  cpu?: { cgroup(): Promise<CgroupParent | null> };
  /**
   * Aborted when the queue says the build was cancelled while a command runs: the command is
   * killed then, rather than run to its end before the next phase hears of the cancel.
   */
  signal?: AbortSignal;
  /**
   * The most a build's output may add up to, holes of sparse files counted (AGENT_IMAGE_MAX_MB):
   * what a deploy could have to write out, as root, from an archive a thousand times smaller.
   * Unbounded when absent or 0.
   */
  imageMaxMb?: number;
  /**
   * Lines of a build command's output the build may ship to the log store a minute
   * (AGENT_LOG_LINES_PER_MINUTE, log-rate-limit.ts); the build's own log keeps its first and
   * last output whatever the rate. No limit when absent or 0.
   */
  logLinesPerMinute?: number;
}

export interface BuildOutcome {
  status: "completed" | "failed" | "cancelled";
  error_message: string;
  result: {
    commit_hash?: string;
    commit_message?: string;
    commit_author?: string;
    commit_committed_at?: string;
    images?: string[];
    /** platform.yaml as authored in the commit: the base config layer and what deploys of the tag run. */
    config?: Record<string, unknown>;
    log: string;
    /** Output of each phase, last 200 lines each. */
    phases: Record<string, string>;
  };
}

/**
 * The stored log keeps a build's first and last output up to these sizes (the middle of a longer
 * log is left out, with a line saying how much): the end is where a failure is told. Together well
 * under what a result may announce (ANNOUNCED_RESULT_MAX_BYTES in deploy-queue), so it is stored whole.
 */
const LOG_HEAD_BYTES = 128 * 1024;
const LOG_TAIL_BYTES = 256 * 1024;
const PHASE_TAIL_LINES = 200;
/** A longer line of a command's output is passed on in pieces of this size (as the runtime's log lines). */
const MAX_LINE_CHARS = 64 * 1024;

class BuildFailure extends Error {}
class BuildCancelled extends Error {}

/**
 * Archives an agent stopped while packaging left beside their final names (`<tag>.tar.gz.<pid>.partial`):
 * removed when the agent starts, before any build could be writing one.
 */
export async function removePartialImages(imageDir: string): Promise<number> {
  let removed = 0;
  for (const app of await readdir(imageDir, { withFileTypes: true }).catch(() => [])) {
    if (!app.isDirectory()) continue;
    for (const file of await readdir(path.join(imageDir, app.name))) {
      if (!file.endsWith(".partial")) continue;
      await rm(path.join(imageDir, app.name, file), { force: true });
      removed++;
    }
  }
  return removed;
}

/** How long a command's output may go on after its process exited before the pipes are closed. */
const OUTPUT_DRAIN_MS = 1_000;
/** The environment variable that marks each process a build command starts (killLeftovers). */
const RUN_MARK = "PLATFORM_BUILD_RUN";

/** Runs a command in its own process group, streaming lines; killed at the deadline. */
function runCommand(
  argv: string[],
  opts: {
    cwd: string;
    env: NodeJS.ProcessEnv;
    deadline: number;
    onLine: (line: string, stream: "stdout" | "stderr") => void;
    /** Asked after each chunk of output: a promise pauses reading until it resolves (see BuildDeps.logRoom). */
    room?: () => Promise<void> | null;
    /** How to spawn a command wrapped with a network of its own (Sandbox.wrap). */
    network?: OwnNetwork | null;
    /** Aborted: the command is killed at once (the build was cancelled). */
    signal?: AbortSignal;
  },
): Promise<{ code: number | null; timedOut: boolean; networkProblem?: string }> {
  const remaining = opts.deadline - Date.now();
  if (remaining <= 0) return Promise.resolve({ code: null, timedOut: true });
  return new Promise((resolve, reject) => {
    const [file, ...args] = argv;
    const run = randomBytes(8).toString("hex");
    const base: Array<"ignore" | "pipe"> = ["ignore", "pipe", "pipe"];
    const stdio = opts.network ? opts.network.stdio(base) : base;
    const child = spawn(file!, args, { cwd: opts.cwd, env: { ...opts.env, [RUN_MARK]: run }, stdio, detached: true }) as ChildProcessByStdio<null, Readable, Readable>;
    const kill = () => {
      try {
        if (child.pid) process.kill(-child.pid, "SIGKILL");
      } catch {
        child.kill("SIGKILL");
      }
    };
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, remaining);
    opts.signal?.addEventListener("abort", kill, { once: true });
    let networkProblem: string | undefined;
    opts.network?.attach(child).catch((e: Error) => {
      networkProblem = e.message;
      kill();
    });
    const splitter = (stream: "stdout" | "stderr") => {
      const decoder = new StringDecoder("utf8");
      let rest = "";
      const emit = (line: string) => {
        for (let at = 0; at < line.length; ) {
          const end = pairSafeEnd(line, at + MAX_LINE_CHARS);
          opts.onLine(line.slice(at, end), stream);
          at = end;
        }
      };
      return {
        data(chunk: Buffer) {
          rest += decoder.write(chunk);
          const lines = rest.split("\n");
          rest = lines.pop() ?? "";
          for (const l of lines) emit(l.replace(/\r$/, ""));
          // Output with no line end in sight goes on in pieces rather than held whole.
          while (rest.length >= MAX_LINE_CHARS) {
            const end = pairSafeEnd(rest, MAX_LINE_CHARS);
            opts.onLine(rest.slice(0, end), stream);
            rest = rest.slice(end);
          }
        },
        end() {
          rest += decoder.end();
          if (rest) emit(rest);
        },
      };
    };
    const out = splitter("stdout");
    const err = splitter("stderr");
    const waitForRoom = () => {
      const room = opts.room?.();
      if (!room) return;
      child.stdout.pause();
      child.stderr.pause();
      void room.then(() => {
        child.stdout.resume();
        child.stderr.resume();
      });
    };
    child.stdout.on("data", (chunk: Buffer) => {
      out.data(chunk);
      waitForRoom();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      err.data(chunk);
      waitForRoom();
    });
    child.once("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    let settled = false;
    const settle = (code: number | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", kill);
      clearTimeout(drain);
      out.end();
      err.end();
      // A process the command left behind ends with it (see killLeftovers), done or timed out.
      void killLeftovers(run).then(() => resolve({ code, timedOut, ...(networkProblem ? { networkProblem } : {}) }));
    };
    let drain: NodeJS.Timeout | undefined;
    // The command's end is its own process's exit. Its output pipes may stay open past that, held by
    // a process it started in a session of its own (a daemon): waiting for them to close waited for
    // that process, past the build's time limit and any cancel.
    child.once("exit", (code) => {
      drain = setTimeout(() => {
        child.stdout.destroy();
        child.stderr.destroy();
        settle(code);
      }, OUTPUT_DRAIN_MS);
    });
    child.once("close", (code) => settle(code));
  });
}

/**
 * Kills every process still carrying the run's mark in its environment: what a command started
 * and left behind, in its process group or out of it (setsid). Processes of other users cannot be
 * read, and are not the agent's to kill.
 */
async function killLeftovers(run: string): Promise<void> {
  const mark = Buffer.from(`${RUN_MARK}=${run}\0`);
  const pids = await readdir("/proc").catch(() => [] as string[]);
  await Promise.all(
    pids
      .filter((p) => /^\d+$/.test(p))
      .map(async (pid) => {
        const environ = await readFile(`/proc/${pid}/environ`).catch(() => null);
        if (!environ?.includes(mark)) return;
        try {
          process.kill(Number(pid), "SIGKILL");
        } catch {
          // gone in between
        }
      }),
  );
}

/**
 * Makes cgroups `name` of a command's own (memory, pids and cpu), where the agent has the limit
 * and the host a usable cgroup, and has `run` run the command in them; answers its outcome, whether it was
 * OOM-killed and whether a fork hit the process limit. A cgroup that cannot be made leaves the
 * command unlimited in that respect rather than failing the build, as for replicas.
 */
async function withLimits<R>(deps: BuildDeps, name: string, run: (cgroups: string[]) => Promise<R>): Promise<R & { oomKilled: boolean; pidsLimited: boolean }> {
  const memoryParent = deps.memory ? await deps.memory.cgroup() : null;
  const memory = memoryParent && deps.memory ? await createMemoryCgroup(memoryParent, name, deps.memory.limitMb).catch(() => null) : null;
  const pidsParent = deps.pids ? await deps.pids.cgroup() : null;
  const pids = pidsParent && deps.pids ? await createPidsCgroup(pidsParent, name, deps.pids.max).catch(() => null) : null;
  const cpuParent = deps.cpu ? await deps.cpu.cgroup() : null;
  const cpu = cpuParent ? await createCpuCgroup(cpuParent, name).catch(() => null) : null;
  const cgroups = [...new Set([memory, pids, cpu].filter((c): c is string => c !== null))];
  try {
    const outcome = await run(cgroups);
    return { ...outcome, oomKilled: memory !== null && (await oomKillCount(memory)) > 0, pidsLimited: pids !== null && (await pidsLimitHits(pids)) > 0 };
  } finally {
    // Not waited for: a cgroup whose processes were just killed stays busy for a moment, and the
    // build goes on meanwhile.
    for (const dir of cgroups) void removeCgroup(dir).catch(() => undefined);
  }
}

/** What the tree under `dir` adds up to, in whole MB rounded up, without its .git: each file's length, holes included. */
async function apparentSizeMb(dir: string, deadline: number): Promise<number> {
  const remaining = deadline - Date.now();
  if (remaining <= 0) throw new BuildFailure("Measuring the build output exceeded the build's time limit.");
  const du = await runQuietly("du", ["-s", "--apparent-size", "--block-size=1M", "--exclude=./.git", "."], { cwd: dir, timeoutMs: remaining, stdout: true });
  if (du.signal) throw new BuildFailure("Measuring the build output exceeded the build's time limit.");
  const mb = Number(/^(\d+)\s/.exec(du.stdout)?.[1]);
  if (du.code !== 0 || !Number.isFinite(mb)) throw new Error(`du could not measure the build output (${endedWith(du)}): ${du.stderr.slice(0, 300)}`);
  return mb;
}

/** The environment of build commands: nothing of the agent's own secrets, a PATH and a HOME. */
function buildEnv(job: BuildJob, home: string): NodeJS.ProcessEnv {
  return {
    // The node the agent runs on first, as for replicas: a build and its service run the same one.
    PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? DEFAULT_PATH}`,
    HOME: home,
    LANG: "C.UTF-8",
    CI: "true",
    PLATFORM_APP: job.app_name,
    PLATFORM_BRANCH: job.branch,
    PLATFORM_BUILD_TAG: job.tag,
  };
}

/**
 * Moves the built tree (what the image holds: everything but .git) to where a deploy on this
 * host looks for the release. Best effort: a deploy that does not find it unpacks the image.
 */
async function keepRelease(src: string, dir: string, workspace: string): Promise<void> {
  if (await stat(dir).catch(() => null)) return;
  try {
    // Moved aside, not deleted: the workspace is removed after the build has answered.
    await rename(path.join(src, ".git"), path.join(workspace, "git")).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOENT") throw err;
    });
    await mkdir(path.dirname(dir), { recursive: true });
    await rename(src, dir);
  } catch {
    // The deploy unpacks the image instead.
  }
}

export async function runBuild(job: BuildJob, deps: BuildDeps): Promise<BuildOutcome> {
  const deadline = Date.now() + deps.timeoutMs;
  const head: string[] = [];
  let headBytes = 0;
  const tail: string[] = [];
  let tailBytes = 0;
  let omitted = { lines: 0, bytes: 0 };
  const phases: Record<string, string[]> = {};
  let current = "setup";
  /** `ship` false: the line goes into the build's own log, not to the log store (see logLinesPerMinute). */
  const emit = (level: LogLevel, message: string, service?: string, ship = true) => {
    if (ship) deps.log({ level, message, service_name: service, phase: current });
    const line = service ? `[${service}] ${message}` : message;
    if (headBytes < LOG_HEAD_BYTES) {
      head.push(line);
      headBytes += line.length + 1;
    } else {
      tail.push(line);
      tailBytes += line.length + 1;
      while (tailBytes > LOG_TAIL_BYTES && tail.length > 1) {
        const out = tail.shift()!;
        tailBytes -= out.length + 1;
        omitted = { lines: omitted.lines + 1, bytes: omitted.bytes + out.length + 1 };
      }
    }
    const phaseTail = (phases[current] ??= []);
    phaseTail.push(line);
    if (phaseTail.length > PHASE_TAIL_LINES) phaseTail.shift();
  };
  // Phase reports are answered later (see phaseReports): a cancel the queue took while a build
  // command ran is known only from the answer to a report sent after it. The phase after a command
  // therefore waits for its own answer, or a cancel during the last command would never be seen.
  let commandRan = false;
  const enter = async (name: string, facts: PhaseFacts = {}) => {
    current = name;
    phases[name] ??= [];
    if (await deps.phase(name, { wait: commandRan, ...facts })) throw new BuildCancelled(`Cancelled before ${name}.`);
    if (Date.now() >= deadline) throw new BuildFailure(`The build exceeded its time limit of ${Math.round(deps.timeoutMs / 1000)} s.`);
  };

  const result: BuildOutcome["result"] = { log: "", phases: {} };
  await mkdir(deps.workDir, { recursive: true });
  const workspace = await mkdtemp(path.join(deps.workDir, `build-${job.build_id.slice(0, 8)}-`));
  const src = path.join(workspace, "src");
  const finish = (status: BuildOutcome["status"], error: string): BuildOutcome => {
    const gap = omitted.lines > 0 ? [`[${omitted.lines} line(s), ${omitted.bytes} characters, left out here: the log keeps a build's first and last output]`] : [];
    result.log = [...head, ...gap, ...tail].join("\n");
    result.phases = Object.fromEntries(Object.entries(phases).map(([k, v]) => [k, v.join("\n")]));
    return { status, error_message: error, result };
  };

  try {
    if (deps.notice) emit("warning", deps.notice);
    await enter("clone");
    const repo = checkRepositoryUrl(job.repository, deps.allowFileRepos);
    if (!repo.ok) throw new BuildFailure(repo.detail);
    emit("info", `Cloning ${job.branch} of ${job.repository}`);
    const env = gitEnv(deps.gitEnv);
    const clone = await runGit(
      // Into a path relative to the workspace: git's messages name it, and the agent's paths are no user's business.
      [...gitProtocolConfig(deps.allowFileRepos), "clone", "--depth", "1", "--single-branch", "--branch", job.branch, "--", job.repository, path.relative(workspace, src)],
      { env, deadline, cwd: workspace },
    );
    if (clone.timedOut) throw new BuildFailure("The clone did not finish within the build's time limit.");
    if (clone.code !== 0) throw new BuildFailure(`Clone failed: ${gitFailureDetail(clone.stderr)}`);
    const show = await runGit(["log", "-1", "--format=%H%n%an <%ae>%n%cI%n%s"], { env, cwd: src, deadline });
    const [hash = "", author = "", committedAt = "", ...subject] = show.stdout.toString("utf8").trimEnd().split("\n");
    const commit = { hash, author, committed_at: committedAt, message: subject.join("\n") };
    Object.assign(result, { commit_hash: hash, commit_author: author, commit_committed_at: committedAt, commit_message: commit.message });
    emit("info", `Commit ${hash.slice(0, 12)} by ${author}: ${subject.join(" ")}`);

    // The queue and the builds row show the commit from here on, while the build runs.
    await enter("config", { commit });
    const configPath = checkConfigPath(job.config_path || "platform.yaml");
    if (!configPath.ok) throw new BuildFailure(configPath.detail);
    // Read by the agent, outside any sandbox: a symbolic link in the repository must not make it
    // read (and print, in the parser's messages) a file of the host's.
    const file = await realpath(path.join(src, configPath.path)).catch(() => null);
    const root = await realpath(src);
    if (file && !file.startsWith(`${root}${path.sep}`)) {
      throw new BuildFailure(`${configPath.path} is a symbolic link to a path outside the repository; the config must be a file in it.`);
    }
    if (!file || !(await stat(file)).isFile()) throw new BuildFailure(`The repository has no ${configPath.path} on ${job.branch}.`);
    const parsed = parseAppConfigYaml(await readFile(file, "utf8"));
    if (!parsed.ok) {
      for (const p of parsed.errors) emit("error", `${configPath.path}: ${problemText(p)}`);
      throw new BuildFailure(`${configPath.path} is invalid, ${problemsSummary(parsed.errors)}`);
    }
    result.config = parsed.config as Record<string, unknown>;
    const config = normalizeAppConfig(parsed.config);
    emit("info", `Config ${configPath.path}: ${config.type} app with ${Object.keys(config.services ?? {}).length} service(s)`);

    const home = path.join(workspace, "home");
    await mkdir(home, { recursive: true });
    // Build commands run as the tenant user: they write the checkout and their home, and reach
    // both through the workspace (made for root alone).
    if (deps.sandbox) {
      await chmod(workspace, 0o711);
      await deps.sandbox.handOver([src, home]);
    }
    // Room is asked for in the share of the log buffer of the app built.
    const built = { group_slug: job.group_slug, app_name: job.app_name, branch: job.branch };
    const logRoom = deps.logRoom && (() => deps.logRoom!(built));
    const perMinute = deps.logLinesPerMinute ?? 0;
    const logRate = new LogRateLimit<string>({ perMinute });
    const tellDropped = () => {
      for (const { dropped, since, context: service } of logRate.notices()) {
        deps.log({
          level: "warning",
          message: `[${dropped} line(s) of this build's output not shipped since ${since.toISOString()}: a build may log ${perMinute} lines a minute; the build's own log keeps its first and last output]`,
          service_name: service,
          phase: current,
        });
      }
    };
    for (const [name, service] of Object.entries(config.services ?? {})) {
      if (!service.build) continue;
      await enter(`build:${name}`);
      emit("info", `$ ${service.build}`, name);
      commandRan = true;
      const command = ["/bin/sh", "-c", service.build];
      const noticeTimer = setInterval(tellDropped, DROPPED_NOTICE_MS);
      const run = await withLimits(deps, `build-${job.build_id}-${name}`, async (cgroups) => {
        const wrapped = deps.sandbox ? await deps.sandbox.wrap(command, { writable: [src, home], chdir: src, dieWithParent: true, ownNetwork: true, bindPorts: [], cgroups }) : null;
        return runCommand(inCgroups(cgroups, wrapped?.argv ?? command), {
          cwd: src,
          env: buildEnv(job, home),
          deadline,
          onLine: (line, stream) => emit(stream === "stderr" ? "warning" : "info", line, name, logRate.admit(job.build_id, name)),
          room: logRoom,
          network: wrapped?.network,
          signal: deps.signal,
        });
      }).finally(() => {
        clearInterval(noticeTimer);
        tellDropped();
      });
      if (deps.signal?.aborted) throw new BuildCancelled(`Cancelled during ${current}.`);
      if (run.networkProblem) throw new BuildFailure(`The build command of service ${name} could not be given its network: ${run.networkProblem}`);
      if (run.timedOut) throw new BuildFailure(`The build of service ${name} exceeded the build's time limit.`);
      if (run.code !== 0 && run.oomKilled) {
        throw new BuildFailure(`The build command of service ${name} was killed for using more than ${deps.memory!.limitMb} MB of memory (the agent's AGENT_BUILD_MEMORY_MB).`);
      }
      if (run.code !== 0 && run.pidsLimited) {
        throw new BuildFailure(
          `The build command of service ${name} exited with code ${run.code} after it was refused a process or thread: it may run ${deps.pids!.max} at once (the agent's AGENT_PIDS_MAX).`,
        );
      }
      if (run.code !== 0) throw new BuildFailure(`The build command of service ${name} exited with code ${run.code}.`);
    }

    await enter("package");
    if (deps.imageMaxMb) {
      const outputMb = await apparentSizeMb(src, deadline);
      if (outputMb > deps.imageMaxMb) {
        throw new BuildFailure(`The build's output adds up to ${outputMb} MB; an image holds at most ${deps.imageMaxMb} MB (the agent's AGENT_IMAGE_MAX_MB).`);
      }
    }
    const image = path.join(deps.imageDir, job.app_name, `${job.tag}.tar.gz`);
    await mkdir(path.dirname(image), { recursive: true });
    // Written beside, then renamed into place: an archive cut short (a timeout, a full disk, the
    // agent stopped) is never taken for the image by a later deploy on this host.
    const partial = `${image}.${process.pid}.partial`;
    // Holes stay holes (--sparse), where unpacking the image would otherwise write them out.
    const tar = await runCommand(["tar", "--sparse", "--exclude=./.git", "-czf", partial, "-C", src, "."], {
      cwd: workspace,
      env: { PATH: process.env.PATH },
      deadline,
      onLine: (line) => emit("warning", line),
    });
    if (tar.timedOut || tar.code !== 0) {
      await rm(partial, { force: true });
      throw new BuildFailure(tar.timedOut ? "Packaging the build output exceeded the build's time limit." : "Packaging the build output failed.");
    }
    await rename(partial, image);
    const size = (await stat(image)).size;
    emit("info", `Image ${job.app_name}:${job.tag} stored (${Math.round(size / 1024)} KiB)`);
    // An image that only this host has would fail the deploys that land on other hosts. The
    // store answering slowly (NATS cut off) must not hold the build past its own time limit.
    let timer: NodeJS.Timeout | undefined;
    const outOfTime = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("it exceeded the build's time limit")), Math.max(0, deadline - Date.now()));
    });
    await Promise.race([deps.publishImage(job.app_name, job.tag, image), outOfTime])
      .catch((err: unknown) => {
        throw new BuildFailure(`Publishing the image ${job.app_name}:${job.tag} to the fleet's image store failed: ${errorText(err)}`);
      })
      .finally(() => clearTimeout(timer));
    if (job.auto_deploy && deps.releaseDir) await keepRelease(src, deps.releaseDir(job), workspace);
    result.images = [`agent://${deps.hostId}/${job.app_name}:${job.tag}`];
    emit("info", `Image ${job.app_name}:${job.tag} published to the fleet's image store`);
    return finish("completed", "");
  } catch (err) {
    if (err instanceof BuildCancelled) {
      emit("warning", err.message);
      return finish("cancelled", err.message);
    }
    const message = err instanceof BuildFailure ? err.message : `The agent failed: ${errorText(err)}`;
    emit("error", message);
    return finish("failed", message);
  } finally {
    await rm(workspace, { recursive: true, force: true }).catch(() => undefined);
  }
}
