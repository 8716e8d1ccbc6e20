/**
 * Credential shapes (spec doc 1 section 5): dispatch on the prefix, SHA-256 at rest, the raw
 * value shown once and never stored.
 */
import { createHash, randomBytes } from "node:crypto";

export const API_KEY_PREFIX = "pf_k1_";
export const SESSION_PREFIX = "ses_";
/** Characters of a key kept for display: the prefix plus six of the random part. */
const SHOWN_CHARS = API_KEY_PREFIX.length + 6;

export type CredentialKind = "api_key" | "session";

/** Which kind a raw credential claims to be; null for a wrong prefix. */
export function credentialKind(raw: string): CredentialKind | null {
  if (raw.startsWith(API_KEY_PREFIX) && raw.length > API_KEY_PREFIX.length) return "api_key";
  if (raw.startsWith(SESSION_PREFIX) && raw.length > SESSION_PREFIX.length) return "session";
  return null;
}

export function hashCredential(raw: string): string {
  return createHash("sha256").update(raw, "utf8").digest("hex");
}

function secret(): string {
  return randomBytes(32).toString("base64url");
}

export function generateApiKey(): string {
  return `${API_KEY_PREFIX}${secret()}`;
}

export function generateSessionToken(): string {
  return `${SESSION_PREFIX}${secret()}`;
}

export function displayPrefix(raw: string): string {
  return raw.slice(0, SHOWN_CHARS);
}
