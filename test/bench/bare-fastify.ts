/**
 * The baseline of the gateway benchmark: a bare Fastify route answering the same body as
 * GET /api/health, in its own process like the gateway, with no platform code on the path.
 */
import Fastify from "fastify";

const app = Fastify({ logger: false });
app.get("/bare", async () => ({ status: "ok", environment: "dev", version: "0.1.0" }));
await app.listen({ port: Number(process.env.PORT), host: "127.0.0.1" });
process.send?.("ready");
process.on("SIGTERM", () => void app.close().then(() => process.exit(0)));
