/**
 * Descriptors the agent inherits are not passed on to what it starts: a real Node process is
 * started with one open beyond stdio, as a shell or a supervisor would leave it.
 */
import { expect, it } from "vitest";
import { spawn } from "node:child_process";
import { openSync, closeSync } from "node:fs";
import { rm } from "node:fs/promises";
import path from "node:path";
import os from "node:os";

const MODULE = path.resolve(import.meta.dirname, "../src/inherited-descriptors.ts");

it("closes a descriptor inherited without close-on-exec before the agent starts anything; what it starts then lacks it", async () => {
  const file = path.join(os.tmpdir(), `inherited-${process.pid}`);
  const inherited = openSync(file, "w");
  // Where a shell or a supervisor leaves one: high up (a shell's own redirections stay below 10).
  const FD = 250;
  const script = `
    const { closeInheritedDescriptors } = await import(${JSON.stringify(MODULE)});
    const { execFileSync } = await import("node:child_process");
    const seen = () => execFileSync("sh", ["-c", "ls -l /proc/self/fd"], { encoding: "utf8" }).includes(${JSON.stringify(file)});
    const before = seen();
    const closed = closeInheritedDescriptors();
    console.log(JSON.stringify({ before, closed, after: seen() }));
  `;
  try {
    const stdio: Array<"ignore" | "pipe" | "inherit" | number> = Array.from({ length: FD + 1 }, () => "ignore");
    stdio[1] = "pipe";
    stdio[2] = "inherit";
    stdio[FD] = inherited;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio });
    let out = "";
    child.stdout!.on("data", (d: Buffer) => (out += String(d)));
    const code = await new Promise((resolve) => child.once("close", resolve));
    expect(code).toBe(0);
    expect(JSON.parse(out)).toEqual({ before: true, closed: expect.arrayContaining([FD]), after: false });
  } finally {
    closeSync(inherited);
    await rm(file, { force: true });
  }
});
