import type { ConnectRouter } from "@connectrpc/connect";
import { HooksService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(HooksService, { readiness: (req) => ctx.readiness(req) });
  };
}
