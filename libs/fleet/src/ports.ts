/** Free TCP ports on the loopback interface, for fleets started side by side. */
import net from "node:net";

function listen(port: number, host: string): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once("error", reject);
    server.listen({ port, host, exclusive: true }, () => resolve(server));
  });
}

function close(server: net.Server): Promise<void> {
  return new Promise((resolve) => server.close(() => resolve()));
}

/** A port nobody listens on right now (listen on port 0, read it, close). */
export async function freePort(host = "127.0.0.1"): Promise<number> {
  const [port] = await freePorts(1, host);
  return port!;
}

/** `n` distinct free ports: all are held open together, then released. */
export async function freePorts(n: number, host = "127.0.0.1"): Promise<number[]> {
  const servers: net.Server[] = [];
  try {
    for (let i = 0; i < n; i++) servers.push(await listen(0, host));
    return servers.map((s) => (s.address() as net.AddressInfo).port);
  } finally {
    await Promise.all(servers.map(close));
  }
}

/** Whether `port` can be listened on at `host`. */
export async function isPortFree(port: number, host = "127.0.0.1"): Promise<boolean> {
  try {
    await close(await listen(port, host));
    return true;
  } catch {
    return false;
  }
}
