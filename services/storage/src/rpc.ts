import type { ConnectRouter } from "@connectrpc/connect";
import { StorageService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(StorageService, { readiness: (req) => ctx.readiness(req) });
  };
}
