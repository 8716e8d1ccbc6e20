/**
 * GIT_PREFLIGHT against real git repositories (the fixtures of test/fixtures, as file:// bare
 * repositories, and served over HTTPS and SSH by real servers on loopback): each of the four
 * answers, and the refusals that come before git.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, readdir, rm, symlink } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { makeFixtureRepo, type FixtureRepo } from "../../test/fixtures/git.ts";
import { gitHttpsUnavailable, gitSshUnavailable, serveGitOverHttps, serveGitOverSsh } from "../../test/fixtures/git-servers.ts";
import { checkConfigPath, gitPreflight, type PreflightDeps } from "../src/preflight.ts";

let workDir: string;
let deps: PreflightDeps;
const repos: Record<"nodeWeb" | "noConfig" | "invalidConfig" | "failingBuild", FixtureRepo> = {} as never;

beforeAll(async () => {
  workDir = await mkdtemp(path.join(os.tmpdir(), "agent-preflight-test-"));
  deps = { workDir, allowFileRepos: true };
  [repos.nodeWeb, repos.noConfig, repos.invalidConfig, repos.failingBuild] = await Promise.all([
    makeFixtureRepo("node-web"),
    makeFixtureRepo("no-config"),
    makeFixtureRepo("invalid-config"),
    makeFixtureRepo("failing-build"),
  ]);
});

afterAll(async () => {
  await Promise.all(Object.values(repos).map((r) => r.cleanup()));
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

/** No temporary clone is left behind. */
async function expectNoClones() {
  const left = await readdir(path.join(workDir, "preflight")).catch(() => []);
  expect(left).toEqual([]);
}

describe("gitPreflight: the four answers", () => {
  it("ready: a valid platform.yaml, with its service names, the commit read and the config as authored", async () => {
    const reply = await gitPreflight({ repository: repos.nodeWeb.url, branch: "main", config_path: "platform.yaml" }, deps);
    expect(reply).toEqual({
      status: "ready",
      result: { reason: "ready", detail: expect.stringContaining("platform.yaml"), services: ["web"], missing_paths: [], errors: [] },
      commit: repos.nodeWeb.head,
      config: { type: "container", services: { web: expect.objectContaining({ run: "node server.js", port: 8080, mount: "/" }) } },
    });
    await expectNoClones();
  });

  it("ready also for a build that will fail: preflight reads the config, it does not build", async () => {
    const reply = await gitPreflight({ repository: repos.failingBuild.url, branch: "main", config_path: "platform.yaml" }, deps);
    expect(reply.status).toBe("ready");
    expect(reply.result?.services).toEqual(["web"]);
  });

  it("needs_config: the branch has no config file; missing_paths names it", async () => {
    const reply = await gitPreflight({ repository: repos.noConfig.url, branch: "main", config_path: "platform.yaml" }, deps);
    expect(reply.status).toBe("needs_config");
    expect(reply.result).toMatchObject({ reason: "config_missing", missing_paths: ["platform.yaml"], services: [], errors: [] });
    expect(reply.result?.detail).toContain("platform.yaml");
    expect(reply.commit).toBe(repos.noConfig.head);
    await expectNoClones();
  });

  it("config_invalid: every schema problem of @platform/app-config, with its place in the file", async () => {
    const reply = await gitPreflight({ repository: repos.invalidConfig.url, branch: "main", config_path: "platform.yaml" }, deps);
    expect(reply.status).toBe("config_invalid");
    expect(reply.result?.reason).toBe("config_invalid");
    expect(reply.result?.services).toEqual([]);
    const errors = reply.result?.errors ?? [];
    expect(errors).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ code: "out_of_range", path: "services.web.port", line: 5 }),
        expect.objectContaining({ code: "unknown_key", path: "services.web.colour", line: 8 }),
      ]),
    );
    expect(reply.commit).toBe(repos.invalidConfig.head);
    await expectNoClones();
  });

  it("config_invalid for YAML that does not parse", async () => {
    const repo = await makeFixtureRepo("node-web", { files: { "platform.yaml": "services:\n  web: [unclosed\n" } });
    try {
      const reply = await gitPreflight({ repository: repo.url, branch: "main", config_path: "platform.yaml" }, deps);
      expect(reply.status).toBe("config_invalid");
      expect(reply.result?.errors[0]).toMatchObject({ code: "yaml_syntax" });
    } finally {
      await repo.cleanup();
    }
  });

  it("no_access: a repository that cannot be read", async () => {
    const missing = `${repos.nodeWeb.url.replace(/\.git$/, "")}-missing.git`;
    const reply = await gitPreflight({ repository: missing, branch: "main", config_path: "platform.yaml" }, deps);
    expect(reply.status).toBe("no_access");
    expect(reply.result?.reason).toBe("repository_unreachable");
    expect(reply.result?.detail).toMatch(/cannot be read/);
    expect(reply.commit).toBeUndefined();
  });

  it("no_access: a branch that does not exist (even when another branch ends with its name)", async () => {
    const repo = await makeFixtureRepo("node-web", { branch: "feature/main-ui" });
    try {
      // `git ls-remote` matches the tail of ref names: refs/heads/feature/main-ui is no branch "main-ui".
      const reply = await gitPreflight({ repository: repo.url, branch: "main-ui", config_path: "platform.yaml" }, deps);
      expect(reply.status).toBe("no_access");
      expect(reply.result).toMatchObject({ reason: "branch_not_found", detail: expect.stringContaining("main-ui") });
      const onBranch = await gitPreflight({ repository: repo.url, branch: "feature/main-ui", config_path: "platform.yaml" }, deps);
      expect(onBranch.status).toBe("ready");
    } finally {
      await repo.cleanup();
    }
    const other = await gitPreflight({ repository: repos.nodeWeb.url, branch: "does-not-exist", config_path: "platform.yaml" }, deps);
    expect(other).toMatchObject({ status: "no_access", result: { reason: "branch_not_found" } });
    await expectNoClones();
  });
});

const noHttps = gitHttpsUnavailable();
const noSsh = gitSshUnavailable();

describe("gitPreflight: over the network", () => {
  it.skipIf(noHttps !== null)(`reads a repository over HTTPS, and says no_access when the server is not trusted or wants a credential${noHttps ? ` (skipped: ${noHttps})` : ""}`, async () => {
    const open = await serveGitOverHttps();
    const locked = await serveGitOverHttps({ password: "s3cret" });
    try {
      const trusted = { ...deps, env: { ...process.env, GIT_SSL_CAINFO: open.caFile } };
      const ready = await gitPreflight({ repository: open.url(repos.nodeWeb.url), branch: "main", config_path: "platform.yaml" }, trusted);
      expect(ready).toMatchObject({ status: "ready", result: { services: ["web"] }, commit: repos.nodeWeb.head });
      const missing = await gitPreflight({ repository: open.url(repos.noConfig.url), branch: "main", config_path: "platform.yaml" }, trusted);
      expect(missing).toMatchObject({ status: "needs_config", commit: repos.noConfig.head });
      // A certificate nothing vouches for is refused, not skipped.
      const untrusted = await gitPreflight({ repository: open.url(repos.nodeWeb.url), branch: "main", config_path: "platform.yaml" }, { ...deps, env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("GIT_SSL"))) });
      expect(untrusted).toMatchObject({ status: "no_access", result: { reason: "repository_unreachable", detail: expect.stringMatching(/certificate/i) } });
      // A repository behind a password the agent does not have: no prompt, an answer.
      const denied = await gitPreflight(
        { repository: locked.url(repos.nodeWeb.url), branch: "main", config_path: "platform.yaml" },
        { ...deps, env: { ...process.env, GIT_SSL_CAINFO: locked.caFile } },
      );
      expect(denied).toMatchObject({ status: "no_access", result: { reason: "repository_unreachable" } });
      await expectNoClones();
    } finally {
      await Promise.all([open.stop(), locked.stop()]);
    }
  });

  it.skipIf(noSsh !== null)(`reads a repository over SSH with the agent's key, and says no_access for a key the server does not know${noSsh ? ` (skipped: ${noSsh})` : ""}`, async () => {
    const ssh = await serveGitOverSsh();
    try {
      const ready = await gitPreflight({ repository: ssh.url(repos.nodeWeb.url), branch: "main", config_path: "platform.yaml" }, { ...deps, env: { ...process.env, GIT_SSH_COMMAND: ssh.sshCommand } });
      expect(ready).toMatchObject({ status: "ready", result: { services: ["web"] }, commit: repos.nodeWeb.head });
      const denied = await gitPreflight(
        { repository: ssh.url(repos.nodeWeb.url), branch: "main", config_path: "platform.yaml" },
        { ...deps, env: { ...process.env, GIT_SSH_COMMAND: ssh.unknownKeySshCommand } },
      );
      expect(denied).toMatchObject({ status: "no_access", result: { reason: "repository_unreachable", detail: expect.stringMatching(/permission denied/i) } });
      await expectNoClones();
    } finally {
      await ssh.stop();
    }
  });
});

describe("gitPreflight: following the branch", () => {
  it("reads the branch's newest commit, and a config_path below the root", async () => {
    const repo = await makeFixtureRepo("no-config");
    try {
      const before = await gitPreflight({ repository: repo.url, branch: "main", config_path: "deploy/app.yaml" }, deps);
      expect(before).toMatchObject({ status: "needs_config", result: { missing_paths: ["deploy/app.yaml"] } });
      const commit = await repo.commit("add a config", {
        "deploy/app.yaml": "services:\n  api:\n    run: node server.js\n    port: 3000\n  worker:\n    run: node worker.js\n    background: true\n",
      });
      const after = await gitPreflight({ repository: repo.url, branch: "main", config_path: "./deploy//app.yaml" }, deps);
      expect(after).toMatchObject({ status: "ready", result: { services: ["api", "worker"] }, commit });
    } finally {
      await repo.cleanup();
    }
  });

  it("follows a symbolic link inside the repository, refuses one leading outside", async () => {
    const repo = await makeFixtureRepo("node-web");
    try {
      await symlink("platform.yaml", path.join(repo.dir, "inside.yaml"));
      await symlink("../../../../etc/passwd", path.join(repo.dir, "outside.yaml"));
      await repo.commit("links");
      const inside = await gitPreflight({ repository: repo.url, branch: "main", config_path: "inside.yaml" }, deps);
      expect(inside).toMatchObject({ status: "ready", result: { services: ["web"] } });
      const outside = await gitPreflight({ repository: repo.url, branch: "main", config_path: "outside.yaml" }, deps);
      expect(outside).toMatchObject({ status: "config_invalid", result: { reason: "config_path_invalid", errors: [] } });
    } finally {
      await repo.cleanup();
    }
  });

  it("a directory at config_path is no config file", async () => {
    const repo = await makeFixtureRepo("node-web", { files: { "conf/readme.txt": "a directory" } });
    try {
      const reply = await gitPreflight({ repository: repo.url, branch: "main", config_path: "conf" }, deps);
      expect(reply).toMatchObject({ status: "needs_config", result: { missing_paths: ["conf"], detail: expect.stringContaining("directory") } });
    } finally {
      await repo.cleanup();
    }
  });

  it("defaults config_path to platform.yaml", async () => {
    const reply = await gitPreflight({ repository: repos.nodeWeb.url, branch: "main" }, deps);
    expect(reply.status).toBe("ready");
  });
});

describe("gitPreflight: refusals before git", () => {
  it("refuses a file:// URL when file repositories are not allowed", async () => {
    const reply = await gitPreflight({ repository: repos.nodeWeb.url, branch: "main", config_path: "platform.yaml" }, { ...deps, allowFileRepos: false });
    expect(reply).toEqual({
      status: "no_access",
      result: {
        reason: "file_repository_not_allowed",
        detail: expect.stringContaining("PLATFORM_ALLOW_FILE_REPOS"),
        services: [],
        missing_paths: [],
        errors: [],
      },
    });
  });

  it("refuses unsupported repository URLs", async () => {
    for (const repository of [repos.nodeWeb.bare, "git://example.com/app.git", "ext::sh -c touch% /tmp/pwned", "-uhelp", "ftp://example.com/app.git"]) {
      const reply = await gitPreflight({ repository, branch: "main", config_path: "platform.yaml" }, deps);
      expect(reply, repository).toMatchObject({ status: "no_access", result: { reason: "repository_unsupported" } });
    }
  });

  it("refuses a config_path that escapes the repository", async () => {
    for (const configPath of ["../platform.yaml", "deploy/../../platform.yaml", "/etc/passwd", "..", "."]) {
      const reply = await gitPreflight({ repository: repos.nodeWeb.url, branch: "main", config_path: configPath }, deps);
      expect(reply, configPath).toMatchObject({ status: "config_invalid", result: { reason: "config_path_invalid", services: [], errors: [] } });
      expect(reply.commit).toBeUndefined();
    }
    await expectNoClones();
  });

  it("refuses an invalid branch name and a malformed request", async () => {
    for (const branch of ["-upload-pack=touch", "a..b", "bad name", "x~1"]) {
      const reply = await gitPreflight({ repository: repos.nodeWeb.url, branch, config_path: "platform.yaml" }, deps);
      expect(reply, branch).toMatchObject({ status: "no_access", result: { reason: "branch_invalid" } });
    }
    for (const request of [null, "x", { branch: "main" }, { repository: repos.nodeWeb.url }, { repository: repos.nodeWeb.url, branch: "main", config_path: 3 }]) {
      const reply = await gitPreflight(request, deps);
      expect(reply, JSON.stringify(request)).toMatchObject({ status: "no_access", result: { reason: "invalid_request" } });
    }
  });

  it("answers no_access/timeout when git does not finish in time", async () => {
    const reply = await gitPreflight({ repository: repos.nodeWeb.url, branch: "main", config_path: "platform.yaml" }, { ...deps, timeoutMs: 1 });
    expect(reply).toMatchObject({ status: "no_access", result: { reason: "timeout" } });
    await expectNoClones();
  });
});

describe("checkConfigPath", () => {
  it("normalizes a config_path inside the repository", () => {
    expect(checkConfigPath("platform.yaml")).toEqual({ ok: true, path: "platform.yaml" });
    expect(checkConfigPath("./apps//web/platform.yaml")).toEqual({ ok: true, path: "apps/web/platform.yaml" });
    expect(checkConfigPath("apps/../platform.yaml")).toMatchObject({ ok: false });
    expect(checkConfigPath("C:/platform.yaml")).toMatchObject({ ok: false });
  });
});
