/**
 * domains-dns: owns its schema, answers readiness. Its capabilities land with their own issues; until
 * then it publishes no routes of its own.
 */
import { loadConfig, serviceEnv } from "@platform/config";
import { startService, type RunningService, type ServiceConfig } from "@platform/service";
import { routes } from "./rpc.ts";

export function build(config: ServiceConfig = loadConfig(serviceEnv("domains-dns"))): Promise<RunningService> {
  return startService({ name: "domains-dns", config, entities: [], migrations: [], routes });
}
