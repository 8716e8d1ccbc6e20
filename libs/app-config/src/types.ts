/**
 * The shape of platform.yaml (ARCHITECTURE section 6) as TypeScript types, the problem type every
 * check returns, and the numeric bounds. One schema, used by preflight, save-config and the agent.
 */

/** `container` (the default) runs processes; `static` is built once and served from the edge. */
export type AppType = "container" | "static";

/**
 * One service of the app. In a `container` app every service runs a process (`run` required); a
 * non-background service serves HTTP on `port`. In a `static` app a service is build-only: it may
 * carry `build` and nothing else.
 */
export interface ServiceConfig {
  /** Shell command run in the repository root at build time. */
  build?: string;
  /** The process to start. Required in a container app. */
  run?: string;
  /**
   * Says the service serves HTTP (required unless background). Each replica is given a port of
   * the host's own in PORT and must listen there: replicas of several releases and apps share a
   * host, so the declared number is not the one bound.
   */
  port?: number;
  /** HTTP path checked before the swap. Not for background services. */
  health?: string;
  /** 1-3, default 1. */
  replicas?: number;
  /** 64-8192, default 256. */
  memory_mb?: number;
  /** Path routing on the front door; absent means unrouted. Not for background services. */
  mount?: string;
  /** A background service has no port, no health check and no mount. Default false. */
  background?: boolean;
}

/** `database`, `cache` and `email` sections. */
export interface FeatureToggle {
  enabled: boolean;
}

export interface DriveConfig {
  name: string;
  /** 1-100 */
  size_gb: number;
  /** Absolute path inside the containers. */
  mount: string;
}

export interface BucketConfig {
  name: string;
}

export interface StorageConfig {
  drives?: DriveConfig[];
  buckets?: BucketConfig[];
}

export interface CronJobConfig {
  name: string;
  /** Five-field cron syntax: minute hour day-of-month month day-of-week. */
  schedule: string;
  /** HTTP path called on the app. */
  path: string;
  /** Default true. */
  enabled?: boolean;
}

/** The `static` section; present exactly when `type` is `static`. */
export interface StaticSiteConfig {
  /** Directory (relative to the repository root) holding the site after the build. */
  dir: string;
  /** Serve the index document for unknown paths. Default false. */
  spa_fallback?: boolean;
  /** Default `index.html`. */
  index_document?: string;
}

/** A validated platform.yaml, as authored (no defaults applied; see `normalizeAppConfig`). */
export interface AppConfig {
  type?: AppType;
  services?: Record<string, ServiceConfig>;
  database?: FeatureToggle;
  cache?: FeatureToggle;
  email?: FeatureToggle;
  storage?: StorageConfig;
  cron?: CronJobConfig[];
  static?: StaticSiteConfig;
}

/** A container-app service with its defaults applied. */
export interface NormalizedServiceConfig extends ServiceConfig {
  replicas: number;
  memory_mb: number;
  background: boolean;
}

/** A static-app service: build-only. */
export interface StaticServiceConfig {
  build?: string;
}

interface NormalizedCommon {
  database: FeatureToggle;
  cache: FeatureToggle;
  email: FeatureToggle;
  storage: { drives: DriveConfig[]; buckets: BucketConfig[] };
  cron: Array<Required<CronJobConfig>>;
}

export interface NormalizedContainerAppConfig extends NormalizedCommon {
  type: "container";
  services: Record<string, NormalizedServiceConfig>;
}

export interface NormalizedStaticAppConfig extends NormalizedCommon {
  type: "static";
  services: Record<string, StaticServiceConfig>;
  static: Required<StaticSiteConfig>;
}

/** An `AppConfig` with every default applied. */
export type NormalizedAppConfig = NormalizedContainerAppConfig | NormalizedStaticAppConfig;

/**
 * Problem codes. Parsing and bounds: `yaml_syntax` (the parser refused the text; message, line and
 * column from the parser), `yaml_unsupported` (valid YAML this config does not accept: a
 * collection used as a mapping key, an unknown tag, or another parser warning), `not_a_mapping`
 * (the document is not a mapping), `too_large`, `too_deep`, `too_many_nodes`.
 * Schema: `unknown_key`, `required`, `wrong_type`, `out_of_range` (numbers and string lengths),
 * `invalid_value` (not one of the allowed values), `invalid_format` (names, paths, cron schedules),
 * `duplicate` (names and mounts that must be unique), `not_allowed` (a known field that this
 * context refuses, e.g. `port` on a background service or `static` on a container app).
 */
export type ConfigProblemCode =
  | "yaml_syntax"
  | "yaml_unsupported"
  | "not_a_mapping"
  | "too_large"
  | "too_deep"
  | "too_many_nodes"
  | "unknown_key"
  | "required"
  | "wrong_type"
  | "out_of_range"
  | "invalid_value"
  | "invalid_format"
  | "duplicate"
  | "not_allowed";

/**
 * One refusal. `path` is a config path (see `formatConfigPath`: `services.web.port`,
 * `cron[0].schedule`), absent for whole-document problems. `line` and `column` are 1-based and
 * present when the problem comes from YAML text and its place is known.
 */
export interface ConfigProblem {
  code: string;
  message: string;
  path?: string;
  line?: number;
  column?: number;
}

/** Bounds applied before anything else. */
export const MAX_CONFIG_BYTES = 64 * 1024;
export const MAX_CONFIG_DEPTH = 16;
export const MAX_CONFIG_NODES = 10_000;
/** The yaml library's alias-expansion guard (its own default). */
export const MAX_ALIAS_COUNT = 100;

/** Field limits of the schema. */
export const LIMITS = {
  replicas: { min: 1, max: 3 },
  memory_mb: { min: 64, max: 8192 },
  port: { min: 1, max: 65535 },
  size_gb: { min: 1, max: 100 },
  nameLength: { min: 1, max: 40 },
  commandLength: { min: 1, max: 4096 },
  pathLength: { max: 512 },
} as const;

export const DEFAULTS = {
  type: "container",
  replicas: 1,
  memory_mb: 256,
  background: false,
  cronEnabled: true,
  spaFallback: false,
  indexDocument: "index.html",
} as const;
