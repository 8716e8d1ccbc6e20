/**
 * The sandbox of tenant code (builds and replicas) on this machine: what of the host it hides.
 * Skipped, and saying why, where bubblewrap cannot run.
 */
import { execFile } from "node:child_process";
import { chmod, lstat, mkdir, mkdtemp, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePorts } from "@platform/fleet";
import { hostSecrets, probeSandbox, Sandbox, TENANT_NICENESS } from "../src/sandbox.ts";

const sandbox = await probeSandbox();
const noSandbox = sandbox.ok ? "" : ` (skipped: ${sandbox.reason})`;

describe("hostSecrets", () => {
  it("hides the agent's whole home, /run and the Docker socket when nothing tenant code runs lives in the home", () => {
    expect(hostSecrets({ home: "/home/agent", pathDirs: ["/usr/local/bin", "/usr/bin", ""], execPath: "/usr/local/bin/node", dockerSocket: "/var/run/docker.sock" })).toEqual([
      "/home/agent",
      "/run",
      "/var/run/docker.sock",
    ]);
  });

  it("hides only the home's credential files when a PATH directory or node itself lives in it", () => {
    for (const opts of [
      { pathDirs: ["/home/agent/.cargo/bin", "/usr/bin"], execPath: "/usr/bin/node" },
      { pathDirs: ["/usr/bin"], execPath: "/home/agent/.nvm/versions/node/v24/bin/node" },
    ]) {
      const hidden = hostSecrets({ home: "/home/agent", ...opts });
      expect(hidden).not.toContain("/home/agent");
      expect(hidden).toEqual(expect.arrayContaining(["/home/agent/.ssh", "/home/agent/.npmrc", "/home/agent/.git-credentials", "/home/agent/.aws", "/run"]));
    }
  });

  it("never hides / as a home", () => {
    expect(hostSecrets({ home: "/", pathDirs: [], execPath: "/usr/bin/node" })).toEqual(["/run"]);
  });
});

const TENANT = { uid: 61000, gid: 61000 };
const asTenant = sandbox.ok ? await probeSandbox(TENANT) : sandbox;
const noScope = !asTenant.ok ? asTenant.reason : (asTenant.scopeProblem ?? "");

describe.skipIf(!sandbox.ok)(`what a sandboxed command can reach${noSandbox}`, () => {
  let dir: string;
  let server: net.Server;
  beforeAll(async () => {
    // Outside /tmp, which the sandbox replaces with its own tmpfs anyway; open to everyone, as a
    // host's directories mostly are.
    dir = await mkdtemp("/var/tmp/agent-sandbox-test-");
    await chmod(dir, 0o755);
    await mkdir(path.join(dir, "secrets"));
    await writeFile(path.join(dir, "secrets", "key"), "sk-in-a-dir");
    await writeFile(path.join(dir, "token"), "sk-in-a-file");
    await writeFile(path.join(dir, "visible"), "shown");
    await writeFile(path.join(dir, "root-only"), "for root's eyes", { mode: 0o600 });
    // Made under an umask of 077, as an agent may be started with.
    await mkdir(path.join(dir, "tree", "sub"), { recursive: true, mode: 0o700 });
    await chmod(path.join(dir, "tree"), 0o700);
    await writeFile(path.join(dir, "tree", "sub", "file"), "x");
    await writeFile(path.join(dir, "outside"), "a file of the host's");
    await symlink(path.join(dir, "outside"), path.join(dir, "tree", "link"));
    server = net.createServer((s) => s.end("hello from the host's socket\n"));
    await new Promise<void>((resolve) => server.listen(path.join(dir, "daemon.sock"), resolve));
  });
  afterAll(async () => {
    await new Promise((r) => server?.close(r));
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const box = () =>
    new Sandbox({
      what: "tests",
      runAs: TENANT,
      hide: [path.join(dir, "secrets"), path.join(dir, "token"), path.join(dir, "daemon.sock"), path.join(dir, "missing"), "/run"],
    });

  async function run(script: string, writable: string[] = [], chdir = "/"): Promise<Record<string, string>> {
    const { argv, sandboxed } = await box().wrap([process.execPath, "-e", script], { writable, chdir, dieWithParent: true });
    expect(sandboxed).toBe(true);
    const { stdout } = await promisify(execFile)(argv[0]!, argv.slice(1));
    return JSON.parse(stdout) as Record<string, string>;
  }

  /** keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING): "ok", or the error's code. */
  const KEYCTL = `const keyctl = () => {
    const py = "import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); r = libc.syscall(${process.arch === "arm64" ? 219 : 250}, 0, -4, 0); print('ok' if r >= 0 else errno.errorcode[ctypes.get_errno()])";
    return require("node:child_process").spawnSync("/usr/bin/python3", ["-c", py], { encoding: "utf8" }).stdout.trim();
  };`;

  it("hides a directory as empty, a file and a socket as unopenable, keeps the kernel's settings read-only; the rest of the host stays readable", async () => {
    const seen = await run(`
      const fs = require("node:fs");
      const net = require("node:net");
      const attempt = (f) => { try { return String(f()); } catch (e) { return e.code; } };
      const connect = (p) => new Promise((resolve) => {
        const s = net.connect(p, () => { s.destroy(); resolve("connected"); });
        s.on("error", (e) => resolve(e.code));
      });
      const status = fs.readFileSync("/proc/self/status", "utf8");
      ${KEYCTL}
      connect(${JSON.stringify(path.join(dir, "daemon.sock"))}).then(async (socket) => console.log(JSON.stringify({
        uid: process.getuid(),
        gid: process.getgid(),
        groups: process.getgroups().join(","),
        capabilities: /^CapEff:\\s*(\\w+)$/m.exec(status)[1],
        permitted: /^CapPrm:\\s*(\\w+)$/m.exec(status)[1],
        bounding: /^CapBnd:\\s*(\\w+)$/m.exec(status)[1],
        savedUid: /^Uid:\\s*\\d+\\s+\\d+\\s+(\\d+)/m.exec(status)[1],
        noNewPrivileges: /^NoNewPrivs:\\s*(\\d)$/m.exec(status)[1],
        rootOnly: attempt(() => fs.readFileSync(${JSON.stringify(path.join(dir, "root-only"))}, "utf8")),
        tmp: attempt(() => { fs.writeFileSync("/tmp/scratch", "ok"); return fs.readFileSync("/tmp/scratch", "utf8"); }),
        shm: attempt(() => { fs.writeFileSync("/dev/shm/scratch", "ok"); return fs.readFileSync("/dev/shm/scratch", "utf8"); }),
        userNamespace: require("node:child_process").spawnSync("unshare", ["-Ur", "true"], { encoding: "utf8" }).stderr.trim(),
        spawns: require("node:child_process").spawnSync("echo", ["yes"], { encoding: "utf8" }).stdout.trim(),
        reusePort: await new Promise((resolve) => { const s = net.createServer().once("error", (e) => resolve(e.code)); s.listen({ port: 0, host: "127.0.0.1", reusePort: true }, () => s.close(() => resolve("listening"))); }),
        plainListen: await new Promise((resolve) => { const s = net.createServer().once("error", (e) => resolve(e.code)); s.listen({ port: 0, host: "127.0.0.1" }, () => s.close(() => resolve("listening"))); }),
        keyring: keyctl(),
        dir: attempt(() => fs.readdirSync(${JSON.stringify(path.join(dir, "secrets"))}).join(",")),
        file: attempt(() => fs.readFileSync(${JSON.stringify(path.join(dir, "token"))}, "utf8")),
        visible: attempt(() => fs.readFileSync(${JSON.stringify(path.join(dir, "visible"))}, "utf8")),
        run: attempt(() => fs.readdirSync("/run").filter((e) => !e.startsWith(".")).join(",")),
        resolv: attempt(() => fs.readFileSync("/etc/resolv.conf").length >= 0),
        // Its own value written back: harmless should the sandbox ever let it through.
        sysctl: attempt(() => fs.writeFileSync("/proc/sys/kernel/printk_ratelimit", fs.readFileSync("/proc/sys/kernel/printk_ratelimit"))),
        socket,
      })));
    `);
    expect(seen).toEqual({
      uid: TENANT.uid,
      gid: TENANT.gid,
      groups: String(TENANT.gid),
      capabilities: "0000000000000000",
      permitted: "0000000000000000",
      bounding: "0000000000000000",
      savedUid: String(TENANT.uid),
      noNewPrivileges: "1",
      rootOnly: "EACCES",
      tmp: "ok",
      shm: "ok",
      userNamespace: expect.stringMatching(/Operation not permitted/),
      spawns: "yes",
      reusePort: "EPERM",
      plainListen: "listening",
      keyring: "EPERM",
      dir: "",
      file: "EACCES",
      visible: "shown",
      run: expect.not.stringMatching(/postgresql|docker/),
      resolv: "true",
      sysctl: expect.stringMatching(/^(EROFS|EACCES)$/),
      socket: expect.stringMatching(/^(EACCES|ECONNREFUSED)$/),
    });
    // The host's own view is untouched.
    expect(await new Promise((resolve) => net.connect(path.join(dir, "daemon.sock")).on("data", (d) => resolve(String(d))))).toBe("hello from the host's socket\n");
  });

  it.skipIf(noScope !== "")(`keeps tenant code from the host's abstract unix sockets and from signals past its sandbox; its own socket it reaches${noScope ? ` (skipped: ${noScope})` : ""}`, async () => {
    const hostName = `\0platform-sandbox-test-${process.pid}`;
    const host = net.createServer((c) => c.on("error", () => undefined).end("from the host\n"));
    await new Promise<void>((resolve) => host.listen(hostName, resolve));
    try {
      const seen = await run(`
        const net = require("node:net");
        const reach = (name) => new Promise((resolve) => {
          const c = net.connect(name, () => { c.destroy(); resolve("connected"); });
          c.on("error", (e) => resolve(e.code));
        });
        const own = net.createServer((c) => c.end());
        own.listen("\\0own-${process.pid}", async () => {
          let signal = "sent";
          try { process.kill(1, 0); } catch (e) { signal = e.code; }
          const out = { host: await reach(${JSON.stringify(hostName)}), own: await reach("\\0own-${process.pid}"), signal };
          own.close();
          console.log(JSON.stringify(out));
        });
      `);
      expect(seen).toEqual({ host: "EPERM", own: "connected", signal: "EPERM" });
    } finally {
      await new Promise((r) => host.close(r));
    }
  });

  it.skipIf(noScope !== "")(`lets a command bind only the TCP ports it is given (a replica its PORT), and any when none are named${noScope ? ` (skipped: ${noScope})` : ""}`, async () => {
    const [own, other] = (await freePorts(2)) as [number, number];
    const script = `
      const net = require("node:net");
      const bind = (port) => new Promise((resolve) => {
        const s = net.createServer().once("error", (e) => resolve(e.code));
        s.listen({ port, host: "127.0.0.1" }, () => s.close(() => resolve("bound")));
      });
      (async () => {
        // On every address, as a replica listens.
        const own = await new Promise((resolve) => {
          const s = net.createServer().once("error", (e) => resolve(e.code));
          s.listen(${own}, () => s.close(() => resolve("bound")));
        });
        console.log(JSON.stringify({ own, other: await bind(${other}), ephemeral: await bind(0) }));
      })();
    `;
    const given = async (bindPorts: number[] | undefined) => {
      const { argv } = await box().wrap([process.execPath, "-e", script], { writable: [], chdir: "/", dieWithParent: true, bindPorts });
      const { stdout } = await promisify(execFile)(argv[0]!, argv.slice(1));
      return JSON.parse(stdout) as Record<string, string>;
    };
    expect(await given([own])).toEqual({ own: "bound", other: "EACCES", ephemeral: "EACCES" });
    expect(await given([])).toEqual({ own: "EACCES", other: "EACCES", ephemeral: "EACCES" });
    expect(await given(undefined)).toEqual({ own: "bound", other: "bound", ephemeral: "bound" });
  });

  it("runs tenant code, and what it starts, at a lower CPU priority it cannot raise back", async () => {
    const seen = await run(`
      const os = require("node:os");
      const raise = () => { try { os.setPriority(0); return "raised"; } catch (e) { return e.info?.code ?? e.code; } };
      const child = require("node:child_process").spawnSync("nice", [], { encoding: "utf8" }).stdout.trim();
      console.log(JSON.stringify({ nice: os.getPriority(), child, raise: raise(), after: os.getPriority() }));
    `);
    expect(seen).toEqual({ nice: TENANT_NICENESS, child: String(TENANT_NICENESS), raise: "EACCES", after: TENANT_NICENESS });
  });

  it.skipIf(noScope !== "")(`hands the command its environment as given, through the Landlock scope${noScope ? ` (skipped: ${noScope})` : ""}`, async () => {
    const { argv } = await box().wrap(["/usr/bin/env"], { writable: [], chdir: "/", dieWithParent: true });
    // No locale: Python, which applies the scope, would add LC_CTYPE to its own.
    const { stdout } = await promisify(execFile)(argv[0]!, argv.slice(1), { env: { PATH: "/usr/bin:/bin", GREETING: "a=b", EMPTY: "" } });
    expect(stdout.split("\n").filter((l) => l && !l.startsWith("PWD=")).sort()).toEqual(["EMPTY=", "GREETING=a=b", "PATH=/usr/bin:/bin"]);
  });

  it("hands a tree over to the tenant user, who then writes it; a link is handed over, never what it points to", async () => {
    const tree = path.join(dir, "tree");
    const before = await run(`
      const fs = require("node:fs");
      try { fs.writeFileSync(${JSON.stringify(path.join(tree, "sub", "new"))}, "y"); console.log(JSON.stringify({ write: "ok" })); }
      catch (e) { console.log(JSON.stringify({ write: e.code })); }
    `, [tree]);
    expect(before).toEqual({ write: "EACCES" });
    await box().handOver([tree]);
    for (const p of ["tree", "tree/sub", "tree/sub/file", "tree/link"]) expect((await lstat(path.join(dir, p))).uid, p).toBe(TENANT.uid);
    expect((await stat(path.join(dir, "outside"))).uid).toBe(0);
    // Run in the tree, as a build in its checkout.
    const after = await run(`
      const fs = require("node:fs");
      fs.writeFileSync("sub/new", "y");
      console.log(JSON.stringify({ write: "ok" }));
    `, [tree], tree);
    expect(after).toEqual({ write: "ok" });
    expect(await readFile(path.join(tree, "sub", "new"), "utf8")).toBe("y");
  });
});
