/**
 * App names as every service keys them (spec doc 1 section 2.1): lowercase slug-like labels that
 * can appear in hostnames. apps-builds writes them so at registration, and every route that takes
 * an `app_name` reads it the same way, so `My Shop` and `MY-SHOP` name the app `my-shop` on the
 * list routes, the queue and the logs alike.
 */

/** A DNS label is at most 63 characters. */
export const HOST_LABEL_MAX = 63;

/** `My Shop_API` → `my-shop-api`. Empty when nothing usable remains. */
export function sanitizeName(input: string): string {
  return input
    .normalize("NFKD")
    .replace(/[\u0300-\u036f]/g, "")
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, HOST_LABEL_MAX)
    .replace(/-+$/g, "");
}

/** The app an `app_name` of a route names: its slug, or the value itself when nothing of it is a slug (it then names no app). */
export function appNameKey(appName: string): string {
  const trimmed = appName.trim();
  return sanitizeName(trimmed) || trimmed;
}
