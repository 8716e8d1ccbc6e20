/**
 * identity: users, groups and the group lock, memberships, API keys, sessions and the audit log.
 * On start it seeds the environment's root key from PLATFORM_ROOT_KEY.
 */
import { identityEnv, loadConfig, type Config } from "@platform/config";
import { startService, type RunningService } from "@platform/service";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService } from "@platform/proto";
import { entities } from "./entities/index.ts";
import { migrations } from "./migrations/0001_identity.ts";
import { groupLockMigrations } from "./migrations/0002_group_lock.ts";
import { seedRootKey } from "./domain/keys.ts";
import { routes } from "./rpc.ts";

export type IdentityConfig = Config<typeof identityEnv>;

export function build(config: IdentityConfig = loadConfig(identityEnv)): Promise<RunningService> {
  return startService({
    name: "identity",
    config,
    entities,
    migrations: [...migrations, ...groupLockMigrations],
    routes: (ctx) => routes(ctx, createServiceClient(AppsBuildsService, config.APPS_BUILDS_URL, { token: config.PLATFORM_INTERNAL_TOKEN })),
    async onStart(ctx) {
      const rootKey = config.PLATFORM_ROOT_KEY;
      if (rootKey) {
        const outcome = await ctx.write((em) => seedRootKey(em, rootKey));
        ctx.logger.info({ outcome }, "root key checked");
      } else {
        ctx.logger.warn("PLATFORM_ROOT_KEY is not set: no root key is seeded");
      }
      return [];
    },
  });
}
