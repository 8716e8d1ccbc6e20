import type { ConnectRouter } from "@connectrpc/connect";
import { MailerService } from "@platform/proto";
import type { ServiceContext } from "@platform/service";

export function routes(ctx: ServiceContext) {
  return (router: ConnectRouter) => {
    router.service(MailerService, { readiness: (req) => ctx.readiness(req) });
  };
}
