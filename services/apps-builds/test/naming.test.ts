import { describe, expect, it } from "vitest";
import { sanitizeName } from "@platform/bus";
import { appNameFrom, branchLabel, checkBranch, withSuffix } from "../src/domain/naming.ts";
import { checkRepository, normalizeRepository } from "../src/domain/repository.ts";
import { checkConfigPath } from "../src/domain/registration.ts";

const status = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    return (err as { status?: number }).status;
  }
  return 0;
};

describe("app names", () => {
  it("sanitises to a lowercase slug-like label", () => {
    expect(sanitizeName("My Shop_API")).toBe("my-shop-api");
    expect(sanitizeName("  Café--Größe!! ")).toBe("cafe-gro-e");
    expect(appNameFrom("Web")).toBe("web");
    expect(sanitizeName("x".repeat(100))).toHaveLength(63);
  });

  it("refuses empty, too long and symbol-only names with 422", () => {
    expect(status(() => appNameFrom(""))).toBe(422);
    expect(status(() => appNameFrom("x".repeat(129)))).toBe(422);
    expect(status(() => appNameFrom("!!!"))).toBe(422);
    expect(appNameFrom("x".repeat(128))).toHaveLength(63);
    // Characters are code points, as the gateway counts them: 64 emoji and "abc" are 67, 128 emoji and "a" 129.
    expect(appNameFrom(`${"😀".repeat(64)}abc`)).toBe("abc");
    expect(status(() => appNameFrom(`${"😀".repeat(128)}a`))).toBe(422);
    // Blanks, or letters no hostname label has, say what a name needs.
    for (const name of ["   ", "日本"]) expect(() => appNameFrom(name)).toThrow("app_name must contain ASCII letters or digits (a-z, 0-9): it becomes a hostname label.");
  });

  it("adds the first free numeric suffix", () => {
    expect(withSuffix("shop", new Set())).toBe("shop");
    expect(withSuffix("shop", new Set(["shop"]))).toBe("shop-2");
    expect(withSuffix("shop", new Set(["shop", "shop-2", "shop-3"]))).toBe("shop-4");
  });
});

describe("branches", () => {
  it("accepts git branch names and labels them for hostnames", () => {
    expect(checkBranch("feature/login")).toBe("feature/login");
    expect(branchLabel("feature/Login")).toBe("feature-login");
    expect(branchLabel("feature_login")).toBe("feature-login");
  });

  it("refuses what git refuses", () => {
    for (const bad of ["", "a..b", "/a", "a/", "a b", "a~1", "a^", "a:b", "x.lock", "a//b", "a@{1}", "-rf", "@", ".hidden", "a/.b", "a.lock/b", "a.", "a\x7f", "a?", "a*", "a[1"]) {
      expect(status(() => checkBranch(bad)), bad).toBe(422);
    }
  });

  it("takes every name git takes that these rules are near", () => {
    for (const good of ["a-b", "a.b", "a@b", "release/1.2", "x/y-lock", "feature/-x", "v1.lock2"]) expect(checkBranch(good)).toBe(good);
  });
});

describe("repositories", () => {
  const dev = { allowFileRepos: true };
  const prod = { allowFileRepos: false };

  it("accepts https, http, ssh and git@host:path", () => {
    for (const url of ["https://github.com/acme/web.git", "http://git.local/acme/web", "ssh://git@github.com/acme/web", "git@github.com:acme/web.git"]) {
      expect(status(() => checkRepository(url, prod)), url).toBe(0);
    }
  });

  it("refuses other schemes with 422, and file:// unless allowed", () => {
    for (const url of ["ftp://host/repo", "github.com/acme/web", "javascript:alert(1)", "", "https:// spaced", "https://example.com/a%00b.git", "https://example.com/a%1Fb.git", "git@host:a\u0001b"]) {
      expect(status(() => checkRepository(url, dev)), url).toBe(422);
    }
    // What the agents would refuse before git is refused here, not left to fail the preflight.
    for (const url of ["ssh://-oProxyCommand=touch%20/tmp/x", "ssh://-u@host/app", "file://remote-host/web.git", `https://example.com/${"a".repeat(2048)}`]) {
      expect(status(() => checkRepository(url, dev)), url).toBe(422);
    }
    expect(status(() => checkRepository("file:///srv/git/web.git", prod))).toBe(422);
    expect(status(() => checkRepository("file:///srv/git/web.git", dev))).toBe(0);
  });

  it("normalises the forms of one repository to one key", () => {
    const key = "github.com/acme/web";
    for (const url of ["https://GitHub.com/Acme/Web.git/", "ssh://git@github.com/acme/web", "ssh://git@github.com:22/acme/web", "git@github.com:acme/web.git", "http://github.com/acme/web", "https://github.com:443/acme/web", "https://www.GitHub.com/acme/web", "https://github.com/acme//web", "git@github.com:acme//web.git"]) {
      expect(normalizeRepository(url), url).toBe(key);
    }
    expect(normalizeRepository("https://github.com/acme/api")).not.toBe(key);
    expect(normalizeRepository("ssh://git@github.com:2222/acme/web")).not.toBe(key);
  });
});

describe("config_path", () => {
  it("defaults to platform.yaml and stays inside the repository", () => {
    expect(checkConfigPath(undefined)).toBe("platform.yaml");
    expect(checkConfigPath("deploy/platform.yaml")).toBe("deploy/platform.yaml");
    for (const bad of ["/etc/passwd", "../x.yaml", "a/../../x", "a//b"]) expect(status(() => checkConfigPath(bad)), bad).toBe(422);
    expect(() => checkConfigPath(`${"a".repeat(252)}.yaml`)).toThrow("config_path must be at most 256 characters.");
  });
});
