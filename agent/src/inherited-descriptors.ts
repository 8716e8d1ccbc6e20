/**
 * Descriptors the agent inherited from whatever started it (a shell's pipe, a supervisor's log or
 * lock): without close-on-exec, they would pass on to every replica and build command it
 * starts, tenant code writing into what belongs to the operator's environment, and holding it
 * open past the platform's stop. Node's own descriptors are all close-on-exec.
 */
import { closeSync, readdirSync, readFileSync } from "node:fs";

const O_CLOEXEC = 0o2000000;

/** Closes every descriptor above stdio that is not close-on-exec, but Node's IPC channel; answers those closed. */
export function closeInheritedDescriptors(): number[] {
  const channel = Number(process.env.NODE_CHANNEL_FD ?? -1);
  const closed: number[] = [];
  let fds: number[];
  try {
    fds = readdirSync("/proc/self/fd").map(Number);
  } catch {
    return closed;
  }
  for (const fd of fds) {
    if (fd <= 2 || fd === channel) continue;
    let info: string;
    try {
      info = readFileSync(`/proc/self/fdinfo/${fd}`, "utf8");
    } catch {
      // Gone meanwhile: the directory listing's own descriptor.
      continue;
    }
    const flags = /^flags:\s*([0-7]+)$/m.exec(info)?.[1];
    if (flags === undefined || (parseInt(flags, 8) & O_CLOEXEC) !== 0) continue;
    closeSync(fd);
    closed.push(fd);
  }
  return closed;
}
