/**
 * The identity a running apps-builds needs in a test: registrations take the group lock from it.
 * Started on the test's database and bus prefix, with the groups the test's callers act in.
 */
import { identityEnv, loadConfig } from "@platform/config";
import { makeCaller } from "@platform/caller";
import { createServiceClient } from "@platform/rpc";
import { IdentityService } from "@platform/proto";
import type { RunningService } from "@platform/service";
import { testNatsUrl } from "@platform/testing";
import { build } from "../../identity/src/app.ts";

export interface TestIdentity {
  service: RunningService;
  /** IDENTITY_URL for apps-builds. */
  url: string;
  client: ReturnType<typeof createServiceClient<typeof IdentityService>>;
}

export const operator = makeCaller({ kind: "api_key", principalId: "root", scope: "admin", platformOperator: true, platformRoot: true });

export async function startIdentity(opts: { databaseUrl: string; prefix: string; groups: string[]; appsBuildsUrl?: string }): Promise<TestIdentity> {
  const service = await build(
    loadConfig(identityEnv, {
      DATABASE_URL: opts.databaseUrl,
      NATS_URL: testNatsUrl(),
      BUS_PREFIX: opts.prefix,
      RPC_PORT: "0",
      LOG_LEVEL: "silent",
      APPS_BUILDS_URL: opts.appsBuildsUrl ?? "",
    }),
  );
  const url = `http://127.0.0.1:${service.rpc.port}`;
  const client = createServiceClient(IdentityService, url, { timeoutMs: 15_000 });
  for (const slug of opts.groups) await client.createGroup({ caller: operator, slug });
  return { service, url, client };
}
