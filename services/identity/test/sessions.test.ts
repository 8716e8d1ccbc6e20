import { describe, expect, it } from "vitest";
import { SESSION_POLICY, extendedIdle, initialWindow, sessionState } from "../src/domain/sessions.ts";
import { credentialKind, displayPrefix, generateApiKey, generateSessionToken, hashCredential } from "../src/domain/credentials.ts";

const DAY = 24 * 3600 * 1000;

describe("session lifetime", () => {
  it("gives browsers 30 idle days, the CLI 24 hours, both a 90-day cap", () => {
    const now = new Date(0);
    expect(initialWindow("browser", now).idleExpiresAt.getTime()).toBe(30 * DAY);
    expect(initialWindow("cli", now).idleExpiresAt.getTime()).toBe(DAY);
    expect(initialWindow("cli", now).absoluteMaxAt.getTime()).toBe(SESSION_POLICY.absoluteMs);
  });

  it("extends the idle window on use but never past the cap", () => {
    const cap = new Date(90 * DAY);
    expect(extendedIdle("browser", new Date(10 * DAY), cap).getTime()).toBe(40 * DAY);
    expect(extendedIdle("browser", new Date(80 * DAY), cap).getTime()).toBe(90 * DAY);
  });

  it("tells live, idle-expired, cap-expired and revoked apart", () => {
    const w = { idleExpiresAt: new Date(10), absoluteMaxAt: new Date(20) };
    expect(sessionState(w, new Date(5))).toBe("live");
    expect(sessionState(w, new Date(10))).toBe("idle_expired");
    expect(sessionState({ idleExpiresAt: new Date(30), absoluteMaxAt: new Date(20) }, new Date(25))).toBe("absolute_expired");
    expect(sessionState({ ...w, revokedAt: new Date(1) }, new Date(5))).toBe("revoked");
  });
});

describe("credentials", () => {
  it("mints pf_k1_ keys and ses_ tokens with 256 random bits, and recognises them by prefix", () => {
    const k = generateApiKey();
    const s = generateSessionToken();
    expect(k).toMatch(/^pf_k1_[A-Za-z0-9_-]{43}$/);
    expect(s).toMatch(/^ses_[A-Za-z0-9_-]{43}$/);
    expect(credentialKind(k)).toBe("api_key");
    expect(credentialKind(s)).toBe("session");
    expect(credentialKind("pf_k2_x")).toBeNull();
    expect(credentialKind("pf_k1_")).toBeNull();
    expect(generateApiKey()).not.toBe(k);
  });

  it("keeps SHA-256 hex and a short display prefix", () => {
    expect(hashCredential("pf_k1_x")).toMatch(/^[0-9a-f]{64}$/);
    expect(displayPrefix("pf_k1_abcdefghijkl")).toBe("pf_k1_abcdef");
  });
});
