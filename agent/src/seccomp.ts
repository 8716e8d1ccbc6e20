/**
 * The seccomp filter of the sandbox (sandbox.ts). Everything is allowed but:
 * - user namespaces: inside one tenant code would be root again, with the kernel's whole
 *   user-namespace surface to probe, and nothing an app or a build needs lives there. `unshare`
 *   and `clone` with CLONE_NEWUSER fail with EPERM; `clone3`, whose flags a filter cannot read,
 *   answers ENOSYS, on which the C library falls back to `clone` (Docker's default profile does
 *   the same);
 * - SO_REUSEPORT: the kernel lets sockets of one user share a port, and every tenant runs as the
 *   one tenant user, so another tenant could take a share of an app's connections. Setting it
 *   fails with EPERM;
 * - the kernel keyring (add_key, request_key, keyctl): keyrings are not namespaced, so the one
 *   tenant user's keyring would be every tenant's to read and fill (Docker's default profile
 *   refuses them too). They fail with EPERM.
 *
 * A classic BPF program, as bubblewrap's `--seccomp` reads it: for x86-64 (and its i386 and x32
 * system calls, which a process there can also make) and arm64.
 */

const LD_W_ABS = 0x20;
const JEQ_K = 0x15;
const JGE_K = 0x35;
const JSET_K = 0x45;
const RET_K = 0x06;

const RET_ALLOW = 0x7fff0000;
const RET_ERRNO = 0x00050000;
const EPERM = 1;
const ENOSYS = 38;
const CLONE_NEWUSER = 0x10000000;
const SOL_SOCKET = 1;
const SO_REUSEPORT = 15;
/** x32 system calls on x86-64 carry this bit: refused, not told apart. */
const X32_SYSCALL_BIT = 0x40000000;

/** Offsets in struct seccomp_data. */
const NR = 0;
const ARCH = 4;
/** The low 32 bits of the arguments (little-endian): the flags of unshare and clone, setsockopt's level and name. */
const ARG0_LOW = 16;
const ARG1_LOW = 24;
const ARG2_LOW = 32;

interface ArchCalls {
  audit: number;
  unshare: number;
  clone: number;
  clone3: number;
  setsockopt: number;
  /** add_key, request_key, keyctl. */
  keyring: number[];
}

const ARCHES: Record<string, ArchCalls[]> = {
  x64: [
    { audit: 0xc000003e, unshare: 272, clone: 56, clone3: 435, setsockopt: 54, keyring: [248, 249, 250] },
    { audit: 0x40000003, unshare: 310, clone: 120, clone3: 435, setsockopt: 366, keyring: [286, 287, 288] },
  ],
  arm64: [{ audit: 0xc00000b7, unshare: 97, clone: 220, clone3: 435, setsockopt: 208, keyring: [217, 218, 219] }],
};

type Insn = { code: number; k: number; jt?: string; jf?: string } | { label: string };

/** The filter for the architecture node runs on; null where none is known (no filter then). */
export function sandboxFilter(arch: string = process.arch): Buffer | null {
  const arches = ARCHES[arch];
  if (!arches) return null;
  const program: Insn[] = [{ code: LD_W_ABS, k: ARCH }];
  arches.forEach((a, i) => program.push({ code: JEQ_K, k: a.audit, jt: `arch${i}` }));
  // Another architecture's calls (a binary of a kind this host should not run): refused.
  program.push({ code: RET_K, k: RET_ERRNO | EPERM });
  arches.forEach((a, i) => {
    program.push(
      { label: `arch${i}` },
      { code: LD_W_ABS, k: NR },
      ...(a.audit === 0xc000003e ? [{ code: JGE_K, k: X32_SYSCALL_BIT, jt: "eperm" }] : []),
      { code: JEQ_K, k: a.unshare, jt: "flags" },
      { code: JEQ_K, k: a.clone, jt: "flags" },
      { code: JEQ_K, k: a.clone3, jt: "enosys" },
      { code: JEQ_K, k: a.setsockopt, jt: "sockopt" },
      ...a.keyring.map((nr) => ({ code: JEQ_K, k: nr, jt: "eperm" })),
      { code: RET_K, k: RET_ALLOW },
    );
  });
  program.push(
    { label: "flags" },
    { code: LD_W_ABS, k: ARG0_LOW },
    { code: JSET_K, k: CLONE_NEWUSER, jt: "eperm" },
    { code: RET_K, k: RET_ALLOW },
    { label: "sockopt" },
    { code: LD_W_ABS, k: ARG1_LOW },
    { code: JEQ_K, k: SOL_SOCKET, jf: "allow" },
    { code: LD_W_ABS, k: ARG2_LOW },
    { code: JEQ_K, k: SO_REUSEPORT, jt: "eperm" },
    { label: "allow" },
    { code: RET_K, k: RET_ALLOW },
    { label: "eperm" },
    { code: RET_K, k: RET_ERRNO | EPERM },
    { label: "enosys" },
    { code: RET_K, k: RET_ERRNO | ENOSYS },
  );
  return assemble(program);
}

/** struct sock_filter[]: jumps are counted from the next instruction. */
function assemble(program: Insn[]): Buffer {
  const at = new Map<string, number>();
  const insns: Array<Extract<Insn, { code: number }>> = [];
  for (const insn of program) {
    if ("label" in insn) at.set(insn.label, insns.length);
    else insns.push(insn);
  }
  const out = Buffer.alloc(insns.length * 8);
  insns.forEach((insn, i) => {
    const jump = (label: string | undefined) => {
      if (label === undefined) return 0;
      const offset = at.get(label)! - (i + 1);
      if (offset < 0 || offset > 255) throw new Error(`seccomp: jump to ${label} out of range`);
      return offset;
    };
    out.writeUInt16LE(insn.code, i * 8);
    out.writeUInt8(jump(insn.jt), i * 8 + 2);
    out.writeUInt8(jump(insn.jf), i * 8 + 3);
    out.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
  });
  return out;
}
