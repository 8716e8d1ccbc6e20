/**
 * The order in which a build command's network namespace is set up (own-network.ts): slirp4netns
 * is started only once bubblewrap has given the namespace its loopback, since both set lo up and
 * bubblewrap fails when the kernel has given lo its address first. A namespace made with
 * `unshare` stands in for bubblewrap's, set up step by step with `ip`.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { promisify } from "node:util";
import { afterEach, expect, it } from "vitest";
import { loopbackReady } from "../src/own-network.ts";
import { findHostTool } from "../src/quiet-command.ts";

const run = promisify(execFile);
const [unshare, nsenter, ip] = await Promise.all(["unshare", "nsenter", "ip"].map((t) => findHostTool(t)));
const missing = !unshare || !nsenter || !ip ? "unshare, nsenter and ip (util-linux, iproute2) are needed" : process.getuid?.() !== 0 ? "a network namespace is made as root here" : "";
const skipped = missing ? ` (skipped: ${missing})` : "";

let sandbox: ChildProcess | undefined;
afterEach(() => {
  sandbox?.kill("SIGKILL");
});

/** A process in a network namespace of its own, as bubblewrap's sandbox is once it reports its pid. */
async function namespaced(): Promise<ChildProcess> {
  sandbox = spawn(unshare!, ["--net", "--", "sleep", "30"], { stdio: "ignore" });
  await new Promise((resolve) => sandbox!.once("spawn", resolve));
  // unshare execs sleep once the namespace is made: until then its namespace is the host's.
  const hostNet = (await run("readlink", ["/proc/self/ns/net"])).stdout;
  await expect.poll(async () => (await run("readlink", [`/proc/${sandbox!.pid}/ns/net`])).stdout).not.toBe(hostNet);
  return sandbox;
}

const settled = (p: Promise<unknown>) => Promise.race([p.then(() => "resolved", (e: Error) => `rejected: ${e.message}`), new Promise((r) => setTimeout(() => r("pending"), 150))]);

it.skipIf(missing !== "")(`waits until the namespace's loopback has its address and is up${skipped}`, async () => {
  const child = await namespaced();
  const inNamespace = (...args: string[]) => run(nsenter!, [`--net=/proc/${child.pid}/ns/net`, "--", ip!, ...args]);
  const ready = loopbackReady(child.pid!, child);
  expect(await settled(ready)).toBe("pending");
  // bubblewrap adds 127.0.0.1 first; lo is still down.
  await inNamespace("addr", "add", "127.0.0.1/8", "dev", "lo");
  expect(await settled(ready)).toBe("pending");
  await inNamespace("link", "set", "lo", "up");
  expect(await settled(ready)).toBe("resolved");
});

it.skipIf(missing !== "")(`gives up when bubblewrap ends before the loopback is up${skipped}`, async () => {
  const child = await namespaced();
  const ready = loopbackReady(child.pid!, child);
  expect(await settled(ready)).toBe("pending");
  child.kill("SIGKILL");
  expect(await settled(ready)).toBe("rejected: bubblewrap ended before it set up the sandbox's loopback");
});
