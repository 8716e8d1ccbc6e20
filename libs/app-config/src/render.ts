/**
 * Stable YAML rendering of a config: keys in the order of ARCHITECTURE section 6, whatever order
 * the value arrived in (a JSONB round trip reorders keys); services and list entries in the order
 * given. Block style, except `{ enabled: ... }` toggles written inline; no line folding.
 */
import { Document, isMap } from "yaml";
import type { AppConfig, CronJobConfig, DriveConfig, ServiceConfig, StaticSiteConfig } from "./types.ts";

const TOP_ORDER = ["type", "services", "database", "cache", "email", "storage", "cron", "static"] as const;
const SERVICE_ORDER = ["build", "run", "port", "health", "replicas", "memory_mb", "mount", "background"] as const;
const DRIVE_ORDER = ["name", "size_gb", "mount"] as const;
const CRON_ORDER = ["name", "schedule", "path", "enabled"] as const;
const STATIC_ORDER = ["dir", "spa_fallback", "index_document"] as const;
const TOGGLES = ["database", "cache", "email"] as const;

/** A copy of `source` with only `keys`, in that order, skipping undefined values. */
function ordered<T extends object>(source: T, keys: readonly (keyof T & string)[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of keys) {
    if (source[key] !== undefined) out[key] = source[key];
  }
  return out;
}

export function renderAppConfigYaml(config: AppConfig): string {
  const shaped: Record<string, unknown> = {};
  for (const key of TOP_ORDER) {
    const value = config[key];
    if (value === undefined) continue;
    switch (key) {
      case "services": {
        const services: Record<string, unknown> = {};
        for (const [name, service] of Object.entries(config.services ?? {})) {
          services[name] = ordered<ServiceConfig>(service, SERVICE_ORDER);
        }
        shaped.services = services;
        break;
      }
      case "storage": {
        const storage: Record<string, unknown> = {};
        if (config.storage?.drives !== undefined) {
          storage.drives = config.storage.drives.map((d) => ordered<DriveConfig>(d, DRIVE_ORDER));
        }
        if (config.storage?.buckets !== undefined) {
          storage.buckets = config.storage.buckets.map((b) => ({ name: b.name }));
        }
        shaped.storage = storage;
        break;
      }
      case "cron":
        shaped.cron = (config.cron ?? []).map((job) => ordered<CronJobConfig>(job, CRON_ORDER));
        break;
      case "static":
        shaped.static = ordered<StaticSiteConfig>(config.static as StaticSiteConfig, STATIC_ORDER);
        break;
      case "database":
      case "cache":
      case "email":
        shaped[key] = { enabled: config[key]?.enabled };
        break;
      default:
        shaped[key] = value;
    }
  }

  const doc = new Document(shaped);
  for (const key of TOGGLES) {
    const node = doc.get(key, true);
    if (isMap(node)) node.flow = true;
  }
  return doc.toString({ lineWidth: 0 });
}
