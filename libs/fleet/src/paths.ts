/**
 * Where things live on a developer machine: the repository root (process entry points are
 * relative to it) and `.data/` (local Postgres and NATS data, the generated root key).
 */
import path from "node:path";
import { fileURLToPath } from "node:url";
import { serviceEnv } from "@platform/config";

export const REPO_ROOT = fileURLToPath(new URL("../../../", import.meta.url)).replace(/[\\/]$/, "");
export const DEFAULT_DATA_DIR = path.join(REPO_ROOT, ".data");
/** Node's compile cache for the fleet's processes (see launch in fleet.ts). */
export const COMPILE_CACHE_DIR = path.join(DEFAULT_DATA_DIR, "compile-cache");

const sharedEnv = serviceEnv("identity");
export const DEFAULT_DATABASE_URL: string = sharedEnv.DATABASE_URL.default;
export const DEFAULT_NATS_URL: string = sharedEnv.NATS_URL.default;

/** The URL with its password replaced, for messages. */
export function redactUrl(raw: string): string {
  try {
    const url = new URL(raw);
    if (url.password) url.password = "***";
    return url.toString();
  } catch {
    return raw;
  }
}
