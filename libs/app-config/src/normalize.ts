/**
 * Defaults and the derived views the platform needs of a validated config.
 */
import {
  DEFAULTS,
  type AppConfig,
  type NormalizedAppConfig,
  type NormalizedServiceConfig,
  type ServiceConfig,
  type StaticServiceConfig,
} from "./types.ts";

/**
 * Every default applied to a validated config: type `container`; database, cache and email
 * `{ enabled: false }`; storage drives and buckets `[]`; cron `[]`, each job `enabled: true`.
 * Container-app services get replicas 1, memory_mb 256, background false (build, run, port,
 * health and mount stay as declared: an absent mount means unrouted, an absent health means no
 * HTTP path check). Static-app services keep only `build`; `static` gets spa_fallback false and
 * index_document `index.html`. The input is not modified.
 */
export function normalizeAppConfig(config: AppConfig): NormalizedAppConfig {
  const common = {
    database: { enabled: config.database?.enabled ?? false },
    cache: { enabled: config.cache?.enabled ?? false },
    email: { enabled: config.email?.enabled ?? false },
    storage: {
      drives: (config.storage?.drives ?? []).map((d) => ({ name: d.name, size_gb: d.size_gb, mount: d.mount })),
      buckets: (config.storage?.buckets ?? []).map((b) => ({ name: b.name })),
    },
    cron: (config.cron ?? []).map((job) => ({
      name: job.name,
      schedule: job.schedule,
      path: job.path,
      enabled: job.enabled ?? DEFAULTS.cronEnabled,
    })),
  };

  if (config.type === "static") {
    const services: Record<string, StaticServiceConfig> = {};
    for (const [name, service] of Object.entries(config.services ?? {})) {
      services[name] = service.build === undefined ? {} : { build: service.build };
    }
    return {
      type: "static",
      services,
      ...common,
      static: {
        dir: config.static?.dir ?? "",
        spa_fallback: config.static?.spa_fallback ?? DEFAULTS.spaFallback,
        index_document: config.static?.index_document ?? DEFAULTS.indexDocument,
      },
    };
  }

  const services: Record<string, NormalizedServiceConfig> = {};
  for (const [name, service] of Object.entries(config.services ?? {})) {
    services[name] = {
      ...service,
      replicas: service.replicas ?? DEFAULTS.replicas,
      memory_mb: service.memory_mb ?? DEFAULTS.memory_mb,
      background: service.background ?? DEFAULTS.background,
    };
  }
  return { type: "container", services, ...common };
}

/** A service with its name. */
export interface NamedService {
  name: string;
  service: ServiceConfig;
}

function containerServices(config: AppConfig): NamedService[] {
  if (config.type === "static") return [];
  return Object.entries(config.services ?? {}).map(([name, service]) => ({ name, service }));
}

/**
 * The services that serve HTTP: not background, with a port (a container app's services in
 * declaration order; none for a static app). These are the health-checked services.
 */
export function httpServices(config: AppConfig): NamedService[] {
  return containerServices(config).filter(({ service }) => service.background !== true && service.port !== undefined);
}

/** The HTTP services with a mount, i.e. routed on the front door, in declaration order. */
export function routedServices(config: AppConfig): NamedService[] {
  return httpServices(config).filter(({ service }) => service.mount !== undefined);
}

export interface FeatureFlags {
  database_enabled: boolean;
  cache_enabled: boolean;
  email_enabled: boolean;
}

/** The app row's feature flags as declared by the config (absent section: false). */
export function deriveFeatureFlags(config: AppConfig | null | undefined): FeatureFlags {
  return {
    database_enabled: config?.database?.enabled === true,
    cache_enabled: config?.cache?.enabled === true,
    email_enabled: config?.email?.enabled === true,
  };
}
