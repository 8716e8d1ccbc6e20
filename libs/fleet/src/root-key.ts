/**
 * The environment's root API key (ARCHITECTURE §7): PLATFORM_ROOT_KEY when set, otherwise the one
 * stored in `.data/root-key`, otherwise a new one stored there (mode 0600) so that it survives
 * restarts of `npm start`. The identity service seeds it on its first start.
 */
import fs from "node:fs";
import path from "node:path";
import { randomBytes } from "node:crypto";

export const ROOT_KEY_PATTERN = /^pf_k1_[A-Za-z0-9_-]{43,}$/;

/** `pf_k1_` followed by 32 random bytes in base64url (43 characters). */
export function generateRootKey(): string {
  return `pf_k1_${randomBytes(32).toString("base64url")}`;
}

export function rootKeyFile(dataDir: string): string {
  return path.join(dataDir, "root-key");
}

function checked(key: string, from: string): string {
  if (!ROOT_KEY_PATTERN.test(key)) {
    throw new Error(`${from} is not a root key: expected pf_k1_ followed by at least 43 base64url characters`);
  }
  return key;
}

export function loadOrCreateRootKey(dataDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const fromEnv = env.PLATFORM_ROOT_KEY?.trim();
  if (fromEnv) return checked(fromEnv, "PLATFORM_ROOT_KEY");
  const file = rootKeyFile(dataDir);
  try {
    return checked(fs.readFileSync(file, "utf8").trim(), file);
  } catch (err) {
    if ((err as { code?: string }).code !== "ENOENT") throw err;
  }
  const key = generateRootKey();
  fs.mkdirSync(dataDir, { recursive: true });
  try {
    fs.writeFileSync(file, `${key}\n`, { mode: 0o600, flag: "wx" });
  } catch (err) {
    // Another process created it first: use theirs.
    if ((err as { code?: string }).code === "EEXIST") return checked(fs.readFileSync(file, "utf8").trim(), file);
    throw err;
  }
  fs.chmodSync(file, 0o600);
  return key;
}
