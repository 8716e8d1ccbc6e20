import type { ConnectRouter } from "@connectrpc/connect";
import { AppsBuildsService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(AppsBuildsService, { readiness: (req) => ctx.readiness(req) });
  };
}
