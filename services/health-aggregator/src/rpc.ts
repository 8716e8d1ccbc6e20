import type { ConnectRouter } from "@connectrpc/connect";
import { HealthAggregatorService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(HealthAggregatorService, { readiness: (req) => ctx.readiness(req) });
  };
}
