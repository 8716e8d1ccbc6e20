/**
 * @platform/app-config: the one schema of platform.yaml (ARCHITECTURE section 6), used by
 * preflight, save-config and the agent alike. Pure: no I/O.
 */
export * from "./types.ts";
export { formatConfigPath, parseConfigPath, isPathElementName, type PathSegment } from "./path.ts";
export { checkConfigBounds, checkConfigSize } from "./bounds.ts";
export { checkCronSchedule } from "./cron.ts";
export { validateAppConfig, checkAppConfig, isMapping, NAME_PATTERN } from "./validate.ts";
export {
  parseAppConfigYaml,
  parseConfigYaml,
  withPositions,
  type AppConfigParseResult,
  type TextPosition,
  type YamlValueResult,
} from "./parse.ts";
export { normalizeAppConfig, httpServices, routedServices, deriveFeatureFlags, type NamedService, type FeatureFlags } from "./normalize.ts";
export { renderAppConfigYaml } from "./render.ts";
export { problemText, problemsSummary } from "./problems.ts";
export { checkRepositoryUrl, shownRepository, MAX_REPOSITORY_LENGTH, SCP_LIKE_REPOSITORY, type RepositoryCheck, type RepositoryKind } from "./repository.ts";
