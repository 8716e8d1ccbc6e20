import type { ConnectRouter } from "@connectrpc/connect";
import { DeployQueueService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(DeployQueueService, { readiness: (req) => ctx.readiness(req) });
  };
}
