/** Every migration of apps-builds' schema, in the order they run. */
import { migrations } from "./0001_apps.ts";
import { variableMigrations } from "./0002_variables.ts";
import { buildMigrations } from "./0003_builds.ts";
import { configMigrations } from "./0004_app_config.ts";
import { settingsMigrations } from "./0005_app_settings.ts";
import { cloneDataMigrations } from "./0006_clone_data.ts";
import { deploymentMigrations } from "./0007_deployments.ts";
import { deployUpdateOrderMigrations } from "./0008_deploy_update_order.ts";
import { firstDeployMigrations } from "./0009_first_deploy.ts";
import { repositoryKeyWwwMigrations } from "./0010_repository_key_www.ts";
import { runningMountsMigrations } from "./0011_running_mounts.ts";
import { branchBaseNamesMigrations } from "./0012_branch_base_names.ts";
import { crashLoopsMigrations } from "./0013_crash_loops.ts";

export const appsBuildsMigrations = [
  ...migrations,
  ...buildMigrations,
  ...configMigrations,
  ...settingsMigrations,
  ...variableMigrations,
  ...cloneDataMigrations,
  ...deploymentMigrations,
  ...deployUpdateOrderMigrations,
  ...firstDeployMigrations,
  ...repositoryKeyWwwMigrations,
  ...runningMountsMigrations,
  ...branchBaseNamesMigrations,
  ...crashLoopsMigrations,
];
