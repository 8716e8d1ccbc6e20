/**
 * Reading the credential of a request (spec doc 1 section 5): `Authorization: Bearer <cred>` or
 * the bare credential, dispatched on its prefix. Any other shape is the one 401.
 */
import { createHash } from "node:crypto";

export const CREDENTIAL_PREFIXES = ["pf_k1_", "ses_"] as const;

/** The raw credential, or null when the header is missing or of no known shape. */
export function readCredential(header: string | undefined): string | null {
  if (!header) return null;
  let value = header.trim();
  const bearer = /^bearer\s+/i.exec(value);
  if (bearer) value = value.slice(bearer[0].length).trim();
  if (!value || /\s/.test(value)) return null;
  return CREDENTIAL_PREFIXES.some((p) => value.startsWith(p) && value.length > p.length) ? value : null;
}

/** Cache key of a credential: never the raw value, so a heap dump shows no usable secret. */
export function credentialDigest(raw: string): string {
  return createHash("sha256").update(raw).digest("base64url");
}
