import { describe, expect, it } from "vitest";
import { appNameKey } from "../src/index.ts";

describe("appNameKey", () => {
  it("reads an app_name as the slug it names, whatever case, accents or separators it is written with", () => {
    expect(appNameKey("my-shop")).toBe("my-shop");
    expect(appNameKey(" My Shop ")).toBe("my-shop");
    expect(appNameKey("Café_API")).toBe("cafe-api");
    expect(appNameKey("WEB")).toBe("web");
    expect(appNameKey("x".repeat(100))).toHaveLength(63);
    // Nothing of it is a slug: it names no app, as written.
    expect(appNameKey("日本")).toBe("日本");
  });
});
