/**
 * Landlock scoping for tenant code (Linux 6.12+, Landlock ABI 6): a sandboxed command cannot
 * connect to an abstract unix socket, or send a signal, outside its own Landlock domain. Abstract
 * unix sockets live in the network namespace, which tenant code shares with the host (sandbox.ts),
 * and no file permission guards them: without the scope, tenant code reaches the host's daemons
 * that listen on one, and other tenants' apps that do.
 *
 * Nothing on a Debian host applies a Landlock scope to a command (setpriv of util-linux 2.38 knows
 * none), so a few lines of Python do it between setpriv and the command: create a ruleset that
 * handles nothing but the scopes, restrict the process to it (setpriv has set no_new_privs), and
 * exec the command, which keeps the domain, as do its children. Each command gets a domain of its
 * own: sandboxes cannot reach each other's sockets either. The command gets the environment the
 * shim was given (/proc/self/environ), not Python's: under the C locale Python adds LC_CTYPE to
 * its own, and a tenant's variables must not be able to steer the shim (-I ignores PYTHON*).
 *
 * The same domain can say which TCP ports the command may bind (Landlock ABI 4, which ABI 6
 * includes): a replica its own PORT alone. Every tenant runs as the one tenant user on the host's
 * network, so without it tenant code could bind the port of another app's replica that crashed,
 * read off /proc/net/tcp, and answer that app's requests. Only an explicit bind is checked: a
 * connection's own local port, and a listen without bind, are not (those ports come from the
 * kernel's ephemeral range).
 */
import { DEFAULT_PATH, findOnPath } from "./quiet-command.ts";

/** LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL. */
const SCOPES = 0x1 | 0x2;
/** LANDLOCK_ACCESS_NET_BIND_TCP, and LANDLOCK_RULE_NET_PORT for landlock_add_rule. */
const BIND_TCP = 0x1;
const RULE_NET_PORT = 2;

/**
 * landlock_create_ruleset (444), landlock_add_rule (445) and landlock_restrict_self (446) are
 * numbered alike on every architecture. struct landlock_ruleset_attr: handled_access_fs,
 * handled_access_net, scoped; struct landlock_net_port_attr: allowed_access, port. The first
 * argument is the ports the command may bind (comma-separated, empty for none) or "-" for any.
 */
const SHIM = `
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def fail(what):
    sys.exit("landlock " + what + ": " + os.strerror(ctypes.get_errno()))
ports = sys.argv[1]
attr = ctypes.create_string_buffer(struct.pack("QQQ", 0, 0 if ports == "-" else ${BIND_TCP}, ${SCOPES}), 24)
fd = libc.syscall(444, attr, ctypes.c_size_t(24), ctypes.c_uint32(0))
if fd < 0:
    fail("scope")
for port in ([] if ports in ("-", "") else ports.split(",")):
    rule = ctypes.create_string_buffer(struct.pack("QQ", ${BIND_TCP}, int(port)), 16)
    if libc.syscall(445, fd, ctypes.c_int(${RULE_NET_PORT}), rule, ctypes.c_uint32(0)) != 0:
        fail("bind rule")
if libc.syscall(446, fd, ctypes.c_uint32(0)) != 0:
    fail("scope")
os.close(fd)
env = dict(e.split(b"=", 1) for e in open("/proc/self/environ", "rb").read().split(b"\\0") if b"=" in e)
os.execvpe(sys.argv[2], sys.argv[2:], env)
`;

/** The shim's first argument: the TCP ports a command may bind, any when absent. */
export function bindArgument(ports: number[] | undefined): string {
  return ports === undefined ? "-" : ports.join(",");
}

/** The prefix that runs a command in a Landlock domain of its own (bindArgument comes next); null without python3 on the system PATH. */
export async function landlockScope(): Promise<string[] | null> {
  // The system's python, not one of a user's PATH (pyenv shims live under a home the sandbox hides).
  const python = await findOnPath("python3", DEFAULT_PATH);
  return python ? [python, "-S", "-I", "-c", SHIM] : null;
}
