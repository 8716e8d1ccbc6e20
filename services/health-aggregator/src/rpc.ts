/** Connect handlers of health-aggregator: thin translations between protobuf and the domain. */
import type { ConnectRouter } from "@connectrpc/connect";
import { HealthAggregatorService } from "@platform/proto";
import { requireCaller } from "@platform/caller";
import type { ServiceContext } from "@platform/service";
import type { LogStore } from "./domain/log-store.ts";

const orUndefined = (value: string | null) => value ?? undefined;

export function routes(ctx: ServiceContext, store: LogStore) {
  return (router: ConnectRouter) => {
    router.service(HealthAggregatorService, {
      readiness: (req) => ctx.readiness(req),

      async queryLogs(req) {
        const caller = requireCaller(req.caller);
        const page = await store.query(
          caller,
          {
            appName: req.appName,
            source: req.source,
            serviceName: req.serviceName,
            deploymentId: req.deploymentId,
            buildId: req.buildId,
            actionId: req.actionId,
            level: req.level,
            search: req.search,
            since: req.since,
            limit: req.limit,
            offset: req.offset,
            branch: req.branch,
          },
        );
        return {
          logs: page.logs.map((r) => ({
            id: BigInt(r.id),
            timestamp: r.timestamp,
            source: r.source,
            level: r.level,
            appName: orUndefined(r.app_name),
            serviceName: orUndefined(r.service_name),
            deploymentId: orUndefined(r.deployment_id),
            buildId: orUndefined(r.build_id),
            actionId: orUndefined(r.action_id),
            instanceId: orUndefined(r.instance_id),
            message: r.message,
            metadataJson: r.metadata,
          })),
          total: page.total,
          hasMore: page.hasMore,
          error: page.error,
          reason: page.reason,
        };
      },
    });
  };
}
