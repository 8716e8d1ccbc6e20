/**
 * The environment's root API key (ARCHITECTURE §7): PLATFORM_ROOT_KEY when set, otherwise the one
 * stored in `.data/root-key`, otherwise a new one stored there (mode 0600) so that it survives
 * restarts of `npm start`. The identity service seeds it at each start: a key it has not seen
 * replaces (revokes) the live root key.
 */
import fs from "node:fs";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { InfrastructureError } from "./infrastructure.ts";

export const ROOT_KEY_PATTERN = /^pf_k1_[A-Za-z0-9_-]{43,}$/;

/** `pf_k1_` followed by 32 random bytes in base64url (43 characters). */
export function generateRootKey(): string {
  return `pf_k1_${randomBytes(32).toString("base64url")}`;
}

/**
 * The fleet's internal token (PLATFORM_INTERNAL_TOKEN) when the environment has none: a new one
 * for each start, since only the processes started together need to share it.
 */
export function internalToken(env: NodeJS.ProcessEnv): string {
  return env.PLATFORM_INTERNAL_TOKEN?.trim() || randomBytes(32).toString("base64url");
}

export function rootKeyFile(dataDir: string): string {
  return path.join(dataDir, "root-key");
}

function checked(key: string, from: string): string {
  if (!ROOT_KEY_PATTERN.test(key)) {
    throw new InfrastructureError(`${from} is not a root key: expected pf_k1_ followed by at least 43 base64url characters`);
  }
  return key;
}

function storedKey(file: string): string | undefined {
  try {
    return fs.readFileSync(file, "utf8").trim();
  } catch {
    return undefined;
  }
}

export function loadOrCreateRootKey(dataDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const file = rootKeyFile(dataDir);
  const fromEnv = env.PLATFORM_ROOT_KEY?.trim();
  if (fromEnv) {
    const key = checked(fromEnv, "PLATFORM_ROOT_KEY");
    // The seed rotates the stored key out (revoked): kept, it would be refused at the next start
    // without the variable. Gone, that start generates a new key, which rotates this one out.
    // The variable's value itself is never written down.
    if (storedKey(file) !== key) fs.rmSync(file, { force: true });
    return key;
  }
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
