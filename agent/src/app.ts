/**
 * The host agent: one per host. It heartbeats and answers its health endpoints; the work
 * consumer, builder, runtime drivers and router arrive with the build and deploy issues.
 */
import http from "node:http";
import { readFileSync } from "node:fs";
import { agentEnv, loadConfig, type Config } from "@platform/config";
import { createLogger, type Logger } from "@platform/logger";
import { connectBus, subjects, traceHeaders } from "@platform/bus";
import { HEARTBEAT_INTERVAL_MS, sampleHeartbeat } from "./heartbeat.ts";

export type AgentConfig = Config<typeof agentEnv>;

const VERSION: string = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;

export interface Agent {
  port: number;
  beat(): Promise<void>;
  close(): Promise<void>;
}

export async function build(config: AgentConfig = loadConfig(agentEnv), logger: Logger = createLogger({ service: "agent", level: config.LOG_LEVEL })): Promise<Agent> {
  const startedAt = new Date();
  const bus = await connectBus({ url: config.NATS_URL, name: `agent-${config.AGENT_HOST_ID}`, prefix: config.BUS_PREFIX ?? "", logger });

  const beat = async () => {
    const hb = await sampleHeartbeat(config.AGENT_HOST_ID, VERSION, startedAt, process.cwd());
    bus.nc.publish(bus.subject(subjects.heartbeat(config.AGENT_HOST_ID)), JSON.stringify(hb), { headers: traceHeaders() });
  };
  await beat();
  const timer = setInterval(() => void beat().catch((err: unknown) => logger.warn({ err }, "heartbeat failed")), HEARTBEAT_INTERVAL_MS);

  const server = http.createServer((req, res) => {
    const path = req.url?.split("?")[0];
    if (req.method === "GET" && (path === "/healthz" || path === "/readyz")) {
      const ready = path === "/healthz" || !bus.nc.isClosed();
      res.writeHead(ready ? 200 : 503, { "content-type": "application/json" });
      res.end(JSON.stringify({ host_id: config.AGENT_HOST_ID, ready, version: VERSION }));
      return;
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ detail: "Not Found" }));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(config.AGENT_HEALTH_PORT, config.AGENT_HEALTH_HOST, () => resolve());
  });
  const port = (server.address() as { port: number }).port;
  logger.info({ host_id: config.AGENT_HOST_ID, port }, "agent ready");

  return {
    port,
    beat,
    async close() {
      clearInterval(timer);
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await bus.close();
    },
  };
}
