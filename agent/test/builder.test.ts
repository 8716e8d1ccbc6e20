/**
 * BUILD on its own against a real git repository (the node-web fixture): the image archive in the
 * host's image store, and, for a build that a deploy follows, the built tree kept where a deploy
 * on this host looks for the release, so it need not unpack the image it was just packed into.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, rmdir, stat, symlink, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { makeFixtureRepo, webConfigBuiltBy, type FixtureRepo } from "../../test/fixtures/git.ts";
import { gitHttpsUnavailable, gitSshUnavailable, serveGitOverHttps, serveGitOverSsh } from "../../test/fixtures/git-servers.ts";
import { removePartialImages, runBuild, type BuildDeps, type BuildJob } from "../src/builder.ts";
import { releaseDir } from "../src/deployer.ts";
import { phaseReports } from "../src/work.ts";
import { probeSandbox, Sandbox } from "../src/sandbox.ts";
import { probeCgroup } from "../src/cgroups.ts";
import { findHostTool } from "../src/quiet-command.ts";

// Build commands run as the agent runs them: sandboxed where this machine can, as the tenant user.
const TENANT = { uid: 61000, gid: 61000 };
const sandbox = await probeSandbox(TENANT);
const noSandbox = sandbox.ok ? "" : ` (skipped: ${sandbox.reason})`;
const memoryCgroup = await probeCgroup("memory");
const pidsCgroup = await probeCgroup("pids");
const cpuCgroup = await probeCgroup("cpu");

let dir: string;
let repo: FixtureRepo;
const published: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "agent-builder-test-"));
  repo = await makeFixtureRepo("node-web");
});

afterAll(async () => {
  await repo?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const deps = (): BuildDeps => ({
  hostId: "host-1",
  workDir: path.join(dir, "work"),
  imageDir: path.join(dir, "images"),
  allowFileRepos: true,
  timeoutMs: 60_000,
  log: () => undefined,
  phase: async () => false,
  publishImage: async (app, tag) => void published.push(`${app}:${tag}`),
  releaseDir: (job) => releaseDir(path.join(dir, "run"), job.group_slug, job.app_name, job.branch, job.tag),
  sandbox: new Sandbox({ hide: [path.join(dir, "work"), path.join(dir, "images"), path.join(dir, "run")], runAs: TENANT, what: "build commands" }),
});

const job = (tag: string, autoDeploy: boolean): BuildJob => ({
  action_id: "a1",
  build_id: "b1",
  app_name: "node-web",
  branch: repo.branch,
  group_slug: "acme",
  repository: repo.url,
  config_path: "platform.yaml",
  tag,
  auto_deploy: autoDeploy,
});

it("keeps the built tree of a build that a deploy follows where the deploy looks for it", async () => {
  const outcome = await runBuild(job("main-00000001", true), deps());
  expect(outcome).toMatchObject({ status: "completed", error_message: "" });
  expect(published).toContain("node-web:main-00000001");
  expect(await stat(path.join(dir, "images", "node-web", "main-00000001.tar.gz"))).toBeTruthy();
  const kept = releaseDir(path.join(dir, "run"), "acme", "node-web", repo.branch, "main-00000001");
  // What the image holds: the build's output included, the repository's history not.
  expect(await readFile(path.join(kept, "dist", "build-info.txt"), "utf8")).toContain("built");
  expect(await readdir(kept)).not.toContain(".git");
  // Nothing is left behind in the work directory.
  expect(await readdir(path.join(dir, "work"))).toEqual([]);
});

it("tells the queue the commit with the phase after the clone, as the result has it", async () => {
  const reported: Array<{ name: string; commit?: unknown }> = [];
  const outcome = await runBuild(job("main-00000003", false), {
    ...deps(),
    phase: async (name, opts) => {
      reported.push({ name, commit: opts?.commit });
      return false;
    },
  });
  expect(outcome.status).toBe("completed");
  const commit = { hash: repo.head, author: expect.stringContaining("Platform Fixtures"), committed_at: expect.any(String), message: expect.any(String) };
  expect(reported.find((r) => r.name === "config")?.commit).toEqual(commit);
  expect(reported.filter((r) => r.commit !== undefined).map((r) => r.name)).toEqual(["config"]);
  expect(outcome.result).toMatchObject({ commit_hash: repo.head });
});

const noHttps = gitHttpsUnavailable();
const noSsh = gitSshUnavailable();

it.skipIf(noHttps !== null)(`clones the branch from a git host over HTTPS${noHttps ? ` (skipped: ${noHttps})` : ""}`, async () => {
  const server = await serveGitOverHttps();
  try {
    const outcome = await runBuild({ ...job("main-00000011", false), repository: server.url(repo.url) }, { ...deps(), gitEnv: { ...process.env, GIT_SSL_CAINFO: server.caFile } });
    expect(outcome).toMatchObject({ status: "completed", result: { commit_hash: repo.head, commit_author: expect.stringContaining("Platform Fixtures") } });
    expect(await stat(path.join(dir, "images", "node-web", "main-00000011.tar.gz"))).toBeTruthy();
  } finally {
    await server.stop();
  }
});

it.skipIf(noSsh !== null)(`clones the branch from a git host over SSH with the agent's key, and fails with git's reason for a key the host refuses${noSsh ? ` (skipped: ${noSsh})` : ""}`, async () => {
  const server = await serveGitOverSsh();
  try {
    const outcome = await runBuild({ ...job("main-00000012", false), repository: server.url(repo.url) }, { ...deps(), gitEnv: { ...process.env, GIT_SSH_COMMAND: server.sshCommand } });
    expect(outcome).toMatchObject({ status: "completed", result: { commit_hash: repo.head } });
    const refused = await runBuild({ ...job("main-00000013", false), repository: server.url(repo.url) }, { ...deps(), gitEnv: { ...process.env, GIT_SSH_COMMAND: server.unknownKeySshCommand } });
    expect(refused).toMatchObject({ status: "failed", error_message: expect.stringMatching(/^Clone failed: .*permission denied/i) });
  } finally {
    await server.stop();
  }
});

it("keeps nothing of a build no deploy follows", async () => {
  const outcome = await runBuild(job("main-00000002", false), deps());
  expect(outcome.status).toBe("completed");
  await expect(stat(releaseDir(path.join(dir, "run"), "acme", "node-web", repo.branch, "main-00000002"))).rejects.toThrow(/ENOENT/);
});

it("fails the build of a branch the repository lacks with git's reason, naming no path of the agent's", async () => {
  const outcome = await runBuild({ ...job("ghost-00000001", false), branch: "ghost" }, deps());
  expect(outcome.status).toBe("failed");
  expect(outcome.error_message).toMatch(/^Clone failed: .*ghost/);
  expect(outcome.error_message).not.toContain(dir);
  expect(outcome.result.log).not.toContain(dir);
});

it("fails the build of an invalid config naming each of its problems, where they are", async () => {
  const invalid = await makeFixtureRepo("invalid-config");
  try {
    const lines: string[] = [];
    const outcome = await runBuild({ ...job("main-00000005", false), repository: invalid.url, branch: invalid.branch }, { ...deps(), log: (line) => void lines.push(line.message) });
    expect(outcome.status).toBe("failed");
    expect(outcome.error_message).toMatch(/^platform\.yaml is invalid, 2 problems: line 5, column 5: services\.web\.port must be from 1 to 65535, not 70000; line 8, column 5: services\.web\.colour: Unknown key "colour" in services\.web; .+\.$/);
    expect(lines.filter((l) => l.startsWith("platform.yaml: line "))).toHaveLength(2);
  } finally {
    await invalid.cleanup();
  }
});

it("fails a build whose image the fleet's store does not take within the build's time limit", async () => {
  const started = Date.now();
  const outcome = await runBuild(job("main-00000003", false), { ...deps(), timeoutMs: 3_000, publishImage: () => new Promise<void>(() => undefined) });
  expect(outcome).toMatchObject({ status: "failed", error_message: expect.stringContaining("exceeded the build's time limit") });
  expect(Date.now() - started).toBeLessThan(10_000);
});

it("fails a build whose output adds up to more than an image may hold, sparse files counted whole; keeps a smaller one's holes", async () => {
  const sparse = await makeFixtureRepo("node-web", { files: { "platform.yaml": webConfigBuiltBy("truncate -s 40M dist-sparse.bin") } });
  try {
    const tooLarge = await runBuild({ ...job("main-00000031", false), repository: sparse.url }, { ...deps(), imageMaxMb: 30 });
    expect(tooLarge).toMatchObject({
      status: "failed",
      error_message: expect.stringMatching(/^The build's output adds up to 4\d MB; an image holds at most 30 MB \(the agent's AGENT_IMAGE_MAX_MB\)\.$/),
    });
    await expect(stat(path.join(dir, "images", "node-web", "main-00000031.tar.gz"))).rejects.toThrow(/ENOENT/);
    const within = await runBuild({ ...job("main-00000032", false), repository: sparse.url }, { ...deps(), imageMaxMb: 100 });
    expect(within.status).toBe("completed");
    // Unpacked as a deploy does: the file has its length, and still no blocks.
    const unpacked = await mkdtemp(path.join(dir, "unpacked-"));
    expect(spawnSync("tar", ["-xzf", path.join(dir, "images", "node-web", "main-00000032.tar.gz"), "-C", unpacked]).status).toBe(0);
    const file = await stat(path.join(unpacked, "dist-sparse.bin"));
    expect(file.size).toBe(40 * 1024 * 1024);
    expect(file.blocks * 512).toBeLessThan(1024 * 1024);
  } finally {
    await sparse.cleanup();
  }
});

it("kills the build command at once when the queue says cancel while it runs, and ends cancelled", async () => {
  const slow = await makeFixtureRepo("node-web", { files: { "platform.yaml": webConfigBuiltBy("echo started && sleep 60") } });
  try {
    const cancel = new AbortController();
    const lines: string[] = [];
    const started = Date.now();
    const outcome = await runBuild(
      { ...job("main-00000041", false), repository: slow.url },
      {
        ...deps(),
        signal: cancel.signal,
        log: (line) => {
          lines.push(line.message);
          if (line.message === "started") setTimeout(() => cancel.abort(), 200);
        },
      },
    );
    expect(outcome).toMatchObject({ status: "cancelled", error_message: "Cancelled during build:web." });
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(lines).toContain("started");
    await expect(stat(path.join(dir, "images", "node-web", "main-00000041.tar.gz"))).rejects.toThrow(/ENOENT/);
  } finally {
    await slow.cleanup();
  }
});

it("stops before packaging when the queue took a cancel while the build command ran", async () => {
  // The queue as the agent hears it: answers come back later than the reports (phaseReports).
  let cancelRequested = false;
  const reports = phaseReports(async () => cancelRequested);
  const outcome = await runBuild(job("main-00000004", false), {
    ...deps(),
    phase: (name, opts) => reports.enter(name, opts),
    log: (line) => {
      // The command's own output: the report of its phase was answered before.
      if (line.service_name && !line.message.startsWith("$ ")) cancelRequested = true;
    },
  });
  expect(outcome).toMatchObject({ status: "cancelled", error_message: "Cancelled before package." });
  await expect(stat(path.join(dir, "images", "node-web", "main-00000004.tar.gz"))).rejects.toThrow(/ENOENT/);
});

/** Pids of the processes whose command line is exactly `argv`. */
async function processesRunning(argv: string[]): Promise<string[]> {
  const found: string[] = [];
  for (const pid of (await readdir("/proc")).filter((p) => /^\d+$/.test(p))) {
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmdline === `${argv.join("\0")}\0`) found.push(pid);
  }
  return found;
}

it("ends a build command when its process exits, though a daemon it started holds its output open, and kills that daemon", async () => {
  // A unique sleep, started in a session of its own (out of the command's process group), keeping stdout open.
  const daemon = ["sleep", "97.25"];
  const leaver = await makeFixtureRepo("node-web", { files: { "platform.yaml": webConfigBuiltBy(`(setsid ${daemon.join(" ")} &) && echo build-finished`) } });
  try {
    const lines: string[] = [];
    const started = Date.now();
    const outcome = await runBuild({ ...job("main-00000009", false), repository: leaver.url }, { ...deps(), log: (l) => void lines.push(l.message) });
    expect(outcome).toMatchObject({ status: "completed", error_message: "" });
    expect(Date.now() - started).toBeLessThan(30_000);
    expect(lines).toContain("build-finished");
    expect(await processesRunning(daemon)).toEqual([]);
  } finally {
    await leaver.cleanup();
  }
});

it.skipIf(!sandbox.ok)(`runs a build command sandboxed: it writes only its checkout, HOME and a private /tmp, and sees neither the agent's files nor its processes${noSandbox}`, async () => {
  // Outside /tmp, which the sandbox replaces with its own tmpfs anyway; open to everyone, as a host's directories mostly are.
  const outside = await mkdtemp("/var/tmp/agent-builder-outside-");
  await chmod(outside, 0o755);
  const secrets = path.join(outside, "secrets");
  await mkdir(secrets);
  await writeFile(path.join(secrets, "root-key"), "sk-root");
  const probe = `
    const fs = require("node:fs");
    const attempt = (f) => { try { f(); return "ok"; } catch (e) { return e.code; } };
    console.log("PROBE " + JSON.stringify({
      checkout: attempt(() => fs.writeFileSync("built-here.txt", "yes")),
      home: attempt(() => fs.writeFileSync(process.env.HOME + "/cache", "yes")),
      tmp: attempt(() => fs.writeFileSync("/tmp/scratch", "yes")),
      host: attempt(() => fs.writeFileSync(${JSON.stringify(path.join(outside, "escaped"))}, "yes")),
      secret: attempt(() => fs.readFileSync(${JSON.stringify(path.join(secrets, "root-key"))}, "utf8")),
      images: attempt(() => fs.readdirSync(${JSON.stringify(path.join(dir, "images"))}).length || fs.readdirSync("/nonexistent")),
      agent: attempt(() => process.kill(${process.pid}, 0)),
      processes: fs.readdirSync("/proc").filter((p) => /^[0-9]+$/.test(p)).length,
      node: process.execPath,
      uid: process.getuid(),
    }));
  `;
  const fixture = await makeFixtureRepo("node-web", { files: { "probe.cjs": probe, "platform.yaml": webConfigBuiltBy("node probe.cjs") } });
  try {
    // The image store of this test's agent has an archive in it by now: hidden, it reads as empty.
    await mkdir(path.join(dir, "images", "seen"), { recursive: true });
    const lines: string[] = [];
    const d = deps();
    const outcome = await runBuild({ ...job("main-0000000a", true), repository: fixture.url }, { ...d, sandbox: new Sandbox({ hide: [path.join(dir, "work"), path.join(dir, "images"), secrets], runAs: TENANT, what: "build commands" }), log: (l) => void lines.push(l.message) });
    expect(outcome, lines.join("\n")).toMatchObject({ status: "completed", error_message: "" });
    const seen = JSON.parse(lines.find((l) => l.startsWith("PROBE "))!.slice("PROBE ".length));
    // The node the agent runs on, wherever it lies (a checkout under /tmp, say): first on the PATH, and readable.
    expect(seen).toMatchObject({ checkout: "ok", home: "ok", tmp: "ok", host: expect.stringMatching(/^(EROFS|EACCES)$/), secret: "ENOENT", agent: "ESRCH", node: process.execPath, uid: TENANT.uid });
    expect(seen.images).not.toBe("ok");
    // Its own pid namespace: the shell, node and the sandbox's init, not the host's processes.
    expect(seen.processes).toBeLessThan(6);
    expect(existsSync(path.join(outside, "escaped"))).toBe(false);
    // What it wrote in its checkout is the build's output: in the release.
    const kept = releaseDir(path.join(dir, "run"), "acme", "node-web", fixture.branch, "main-0000000a");
    expect(await readFile(path.join(kept, "built-here.txt"), "utf8")).toBe("yes");
  } finally {
    await fixture.cleanup();
    await rm(outside, { recursive: true, force: true });
  }
});

const slirp = sandbox.ok && sandbox.user ? await findHostTool("slirp4netns") : null;
const noOwnNetwork = !sandbox.ok ? noSandbox : !sandbox.user ? ` (skipped: ${sandbox.userProblem})` : !slirp ? " (skipped: slirp4netns is not installed)" : "";
it.skipIf(noOwnNetwork !== "")(`gives a build command a network of its own: it serves itself on 127.0.0.1, and no listener of the host's loopback is in sight (what it reaches outward: tenant-fence.test.ts)${noOwnNetwork}`, async () => {
  const host = net.createServer((c) => c.end("host"));
  await new Promise<void>((resolve) => host.listen(0, "127.0.0.1", resolve));
  const hostPort = (host.address() as net.AddressInfo).port;
  const probe = `
    const net = require("node:net");
    const fs = require("node:fs");
    const read = (port, address) => new Promise((resolve) => {
      const s = net.connect(port, address);
      let got = "";
      s.setTimeout(5000, () => { s.destroy(); resolve("timeout"); });
      s.on("data", (c) => (got += c));
      s.on("end", () => resolve(got));
      s.on("error", (e) => resolve(e.code));
    });
    (async () => {
      const own = net.createServer((c) => c.end("self"));
      await new Promise((r) => own.listen(0, "127.0.0.1", r));
      const self = await read(own.address().port, "127.0.0.1");
      own.close();
      console.log("NET " + JSON.stringify({
        self,
        hostLoopback: await read(${hostPort}, "127.0.0.1"),
        nameserver: fs.readFileSync("/etc/resolv.conf", "utf8").match(/^nameserver (.*)$/m)?.[1],
        synRetries: fs.readFileSync("/proc/sys/net/ipv4/tcp_syn_retries", "utf8").trim(),
      }));
    })();
  `;
  const fixture = await makeFixtureRepo("node-web", { files: { "probe.cjs": probe, "platform.yaml": webConfigBuiltBy("node probe.cjs") } });
  try {
    const lines: string[] = [];
    const outcome = await runBuild({ ...job("main-0000000e", false), repository: fixture.url }, { ...deps(), log: (l) => void lines.push(l.message) });
    expect(outcome, lines.join("\n")).toMatchObject({ status: "completed", error_message: "" });
    const seen = JSON.parse(lines.find((l) => l.startsWith("NET "))!.slice("NET ".length));
    // A connection slirp4netns cannot make goes unanswered: it fails after 3 SYN retries, not 6.
    expect(seen).toEqual({ self: "self", hostLoopback: "ECONNREFUSED", nameserver: "10.0.2.3", synRetries: "3" });
  } finally {
    await fixture.cleanup();
    await new Promise((r) => host.close(r));
  }
});

it.skipIf(!memoryCgroup.ok)(`fails a build command that uses more memory than the agent allows, saying so${memoryCgroup.ok ? "" : ` (skipped: ${memoryCgroup.reason})`}`, async () => {
  const hungry = await makeFixtureRepo("node-web", {
    files: {
      // Touches 1 MiB more every millisecond until something stops it.
      "hungry.js": "const kept = []; setInterval(() => kept.push(Buffer.alloc(1 << 20, 1)), 1); setTimeout(() => console.log('never stopped'), 30000);\n",
      "platform.yaml": webConfigBuiltBy("node hungry.js"),
    },
  });
  try {
    const cgroup = memoryCgroup.ok ? memoryCgroup.cgroup : null;
    const outcome = await runBuild({ ...job("main-0000000c", false), repository: hungry.url }, { ...deps(), memory: { limitMb: 160, cgroup: async () => cgroup } });
    expect(outcome).toMatchObject({
      status: "failed",
      error_message: "The build command of service web was killed for using more than 160 MB of memory (the agent's AGENT_BUILD_MEMORY_MB).",
    });
    // Its cgroup goes with it.
    await expect.poll(async () => (await readdir(cgroup!.dir)).filter((d) => d.startsWith("platform-build-b1-")), { timeout: 5_000 }).toEqual([]);
  } finally {
    await hungry.cleanup();
  }
});

it.skipIf(!pidsCgroup.ok)(`fails a build command that forks past the agent's process limit, saying so${pidsCgroup.ok ? "" : ` (skipped: ${pidsCgroup.reason})`}`, async () => {
  const forky = await makeFixtureRepo("node-web", { files: { "platform.yaml": webConfigBuiltBy("for i in $(seq 1 64); do sleep 5 & done; wait") } });
  try {
    const cgroup = pidsCgroup.ok ? pidsCgroup.cgroup : null;
    const lines: string[] = [];
    const outcome = await runBuild({ ...job("main-0000000e", false), repository: forky.url }, { ...deps(), pids: { max: 16, cgroup: async () => cgroup }, log: (l) => void lines.push(l.message) });
    expect(outcome.status).toBe("failed");
    expect(outcome.error_message).toMatch(/^The build command of service web exited with code \d+ after it was refused a process or thread: it may run 16 at once \(the agent's AGENT_PIDS_MAX\)\.$/);
    expect(lines.join("\n")).toMatch(/fork/i);
    await expect.poll(async () => (await readdir(cgroup!.dir)).filter((d) => d.startsWith("platform-build-b1-")), { timeout: 5_000 }).toEqual([]);
  } finally {
    await forky.cleanup();
  }
});

it.skipIf(!cpuCgroup.ok)(`runs a build command in a cgroup weighing its processes together on the CPU, where it sees no other cgroup${cpuCgroup.ok ? "" : ` (skipped: ${cpuCgroup.reason})`}`, async () => {
  const cgroup = cpuCgroup.ok ? cpuCgroup.cgroup : null;
  // Another tenant's build, as far as the cgroup tree tells.
  const other = path.join(cgroup!.dir, `platform-build-other-${process.pid}`);
  await mkdir(other);
  const weighed = await makeFixtureRepo("node-web", { files: { "platform.yaml": webConfigBuiltBy(`cat /proc/self/cgroup; echo listed=$(ls ${cgroup!.dir})`) } });
  try {
    const lines: string[] = [];
    const outcome = await runBuild({ ...job("main-0000000f", false), repository: weighed.url }, { ...deps(), cpu: { cgroup: async () => cgroup }, log: (l) => void lines.push(l.message) });
    expect(outcome.status).toBe("completed");
    // v1: the cpu hierarchy's line; v2: the one unified line. Either names the build's own cgroup.
    const line = lines.find((l) => (cgroup!.version === 1 ? /^\d+:([^:]*,)?cpu(,[^:]*)?:/ : /^0::/).test(l));
    expect(line).toMatch(/\/platform-build-b1-[^/]*$/);
    if (sandbox.ok) expect(lines.find((l) => l.startsWith("listed="))).toBe(`listed=${path.basename(line!)}`);
    await expect.poll(async () => (await readdir(cgroup!.dir)).filter((d) => d.startsWith("platform-build-b1-")), { timeout: 5_000 }).toEqual([]);
  } finally {
    await rmdir(other);
    await weighed.cleanup();
  }
});

it("refuses a platform.yaml that links outside the repository, printing nothing of the file it names", async () => {
  const outside = await mkdtemp("/var/tmp/agent-builder-link-");
  await writeFile(path.join(outside, "secret.yaml"), "pf_k1_CANARY0123456789abcdef: {x: 1}\n", { mode: 0o600 });
  const linked = await makeFixtureRepo("node-web");
  try {
    await rm(path.join(linked.dir, "platform.yaml"));
    await symlink(path.join(outside, "secret.yaml"), path.join(linked.dir, "platform.yaml"));
    await linked.commit("config elsewhere");
    const lines: string[] = [];
    const outcome = await runBuild({ ...job("main-0000000b", false), repository: linked.url }, { ...deps(), log: (l) => void lines.push(l.message) });
    expect(outcome).toMatchObject({ status: "failed", error_message: "platform.yaml is a symbolic link to a path outside the repository; the config must be a file in it." });
    expect(lines.join("\n")).not.toContain("CANARY");
  } finally {
    await linked.cleanup();
    await rm(outside, { recursive: true, force: true });
  }
});

it("removes the partial archives an agent stopped while packaging left, and nothing else", async () => {
  const images = path.join(dir, "partials");
  await mkdir(path.join(images, "shop"), { recursive: true });
  await writeFile(path.join(images, "shop", "main-1.tar.gz"), "a whole archive");
  await writeFile(path.join(images, "shop", "main-2.tar.gz.4242.partial"), "cut short");
  expect(await removePartialImages(images)).toBe(1);
  expect(await readdir(path.join(images, "shop"))).toEqual(["main-1.tar.gz"]);
  expect(await removePartialImages(path.join(dir, "no-such-dir"))).toBe(0);
});

it("passes on a command's endless line in pieces, no half of a character in any", async () => {
  const long = await makeFixtureRepo("node-web", {
    files: {
      // 300,000 characters with no line end, then a line of its own.
      "long.js": 'process.stdout.write("a" + "\\u{1F600}".repeat(150000)); process.stdout.write("\\ndone\\n");',
      "platform.yaml": webConfigBuiltBy("node long.js"),
    },
  });
  try {
    const lines: string[] = [];
    const outcome = await runBuild({ ...job("main-00000005", false), repository: long.url }, { ...deps(), log: (l) => void (l.service_name === "web" && lines.push(l.message)) });
    expect(outcome).toMatchObject({ status: "completed", error_message: "" });
    const output = lines.filter((l) => !l.startsWith("$ "));
    expect(output.at(-1)).toBe("done");
    const pieces = output.slice(0, -1);
    expect(pieces.length).toBeGreaterThan(1);
    for (const piece of pieces) {
      expect(piece.length).toBeLessThanOrEqual(64 * 1024);
      expect(piece.isWellFormed()).toBe(true);
    }
    expect(pieces.join("")).toBe(`a${"\u{1F600}".repeat(150000)}`);
  } finally {
    await long.cleanup();
  }
});

it("keeps the first and last output of a long build in its stored log, and waits on its output while the log has no room", async () => {
  const noisy = await makeFixtureRepo("node-web");
  try {
    await noisy.commit("noisy build", {
      "noisy.js": "for (let i = 0; i < 20000; i++) console.log(`line ${i} ${'x'.repeat(60)}`);\nconsole.log('the end');\nprocess.exitCode = 1;\n",
      "platform.yaml": webConfigBuiltBy("node noisy.js"),
    });
    const lines: string[] = [];
    let waits = 0;
    let full = 2000;
    const asked = new Set<string>();
    const noisyJob = { ...job("main-00000009", false), repository: noisy.url, branch: noisy.branch };
    const outcome = await runBuild(noisyJob, {
      ...deps(),
      log: (line) => void lines.push(line.message),
      // A shipper with no room every 2,000 lines, for a moment.
      logRoom: (of) => {
        asked.add(JSON.stringify(of));
        if (lines.length < full) return null;
        full += 2000;
        waits++;
        return new Promise<void>((r) => setTimeout(r, 5));
      },
    });
    expect(outcome).toMatchObject({ status: "failed", error_message: "The build command of service web exited with code 1." });
    expect(waits).toBeGreaterThan(0);
    // Room is asked for the app built: its share of the shipper's buffer.
    expect([...asked]).toEqual([JSON.stringify({ group_slug: noisyJob.group_slug, app_name: noisyJob.app_name, branch: noisyJob.branch })]);
    // Nothing was lost or reordered while the command waited.
    const output = lines.filter((l) => l.startsWith("line "));
    expect(output).toHaveLength(20000);
    expect(output.every((l, i) => l.startsWith(`line ${i} `))).toBe(true);
    expect(lines).toContain("the end");
    const log = outcome.result.log;
    expect(log.length).toBeLessThan(512 * 1024);
    expect(log).toContain("[web] line 0 ");
    expect(log).toMatch(/\n\[\d+ line\(s\), \d+ characters, left out here: the log keeps a build's first and last output\]\n/);
    expect(log).toContain("[web] line 19999 ");
    expect(log).toContain("[web] the end");
  } finally {
    await noisy.cleanup();
  }
});

it("ships a build's output to the log store up to its log rate limit, says how much it held back, and keeps the build's own log whole at both ends", async () => {
  const noisy = await makeFixtureRepo("node-web");
  try {
    await noisy.commit("noisy build", {
      "noisy.js": "for (let i = 0; i < 20000; i++) console.log(`line ${i}`);\nconsole.log('the end');\n",
      "platform.yaml": webConfigBuiltBy("node noisy.js"),
    });
    const shipped: Array<{ message: string; level: string; service_name?: string }> = [];
    const outcome = await runBuild(
      { ...job("main-0000000c", false), repository: noisy.url, branch: noisy.branch },
      { ...deps(), logLinesPerMinute: 600, log: (line) => void shipped.push(line) },
    );
    expect(outcome).toMatchObject({ status: "completed", error_message: "" });
    const output = shipped.filter((l) => /^line \d+$/.test(l.message) || l.message === "the end");
    // A minute's worth at once, and a few more as the allowance refills while the command runs.
    expect(output.length).toBeGreaterThanOrEqual(600);
    expect(output.length).toBeLessThan(700);
    expect(output.slice(0, 600).map((l) => l.message)).toEqual(Array.from({ length: 600 }, (_, i) => `line ${i}`));
    const notices = shipped.filter((l) => l.message.includes("of this build's output not shipped"));
    expect(notices.length).toBeGreaterThan(0);
    for (const n of notices) {
      expect(n).toMatchObject({ level: "warning", service_name: "web" });
      expect(n.message).toMatch(/^\[\d+ line\(s\) of this build's output not shipped since \S+: a build may log 600 lines a minute; the build's own log keeps its first and last output\]$/);
    }
    const held = notices.reduce((sum, n) => sum + Number(/^\[(\d+)/.exec(n.message)![1]), 0);
    expect(output.length + held).toBe(20001);
    expect(outcome.result.log).toContain("[web] line 0\n");
    expect(outcome.result.log).toContain("[web] line 19999\n");
    expect(outcome.result.log).toContain("[web] the end");
  } finally {
    await noisy.cleanup();
  }
});
