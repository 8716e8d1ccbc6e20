import type { ConnectRouter } from "@connectrpc/connect";
import { DomainsDnsService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(DomainsDnsService, { readiness: (req) => ctx.readiness(req) });
  };
}
