import "@platform/service/heap";
import { gatewayEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(gatewayEnv);
runMain("gateway", async () => {
  const gateway = await build(config);
  await gateway.app.listen({ port: config.PORT, host: config.HOST });
  return gateway;
});
