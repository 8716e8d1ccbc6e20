import { describe, expect, it } from "vitest";
import { checkRepositoryUrl, shownRepository } from "../src/index.ts";

describe("checkRepositoryUrl", () => {
  it("accepts the schemes of ARCHITECTURE section 8", () => {
    expect(checkRepositoryUrl("https://github.com/acme/app.git", false)).toEqual({ ok: true, kind: "https" });
    expect(checkRepositoryUrl("http://git.internal/acme/app", false)).toEqual({ ok: true, kind: "http" });
    expect(checkRepositoryUrl("ssh://git@github.com/acme/app.git", false)).toEqual({ ok: true, kind: "ssh" });
    expect(checkRepositoryUrl("git@github.com:acme/app.git", false)).toEqual({ ok: true, kind: "scp" });
    expect(checkRepositoryUrl("file:///srv/git/app.git", true)).toEqual({ ok: true, kind: "file" });
    expect(checkRepositoryUrl("file:///srv/git/app.git", false)).toMatchObject({ ok: false, reason: "file_repository_not_allowed" });
  });

  it("refuses what git could take for an option, control characters written or encoded, and other schemes", () => {
    const bad = [
      "ssh://-oProxyCommand=x/app",
      "ssh://-oProxyCommand=touch%20/tmp/x",
      "ssh://-user@host/app",
      "git@-oProxy:x",
      "--upload-pack=x",
      "ext::sh -c x",
      "https://",
      "file://remote-host/app.git",
      "github.com/acme/app",
      "https://example.com/a%00b.git",
      "",
      `https://example.com/${"a".repeat(2048)}`,
    ];
    for (const url of bad) expect(checkRepositoryUrl(url, true), url).toMatchObject({ ok: false, reason: "repository_unsupported" });
  });
});

describe("shownRepository", () => {
  it("hides the credentials of a URL and leaves the rest as written", () => {
    expect(shownRepository("https://x-access-token:ghp_secret@github.com/acme/app.git")).toBe("https://***@github.com/acme/app.git");
    expect(shownRepository("https://ghp_secret@GitHub.com/acme/app.git")).toBe("https://***@GitHub.com/acme/app.git");
    expect(shownRepository("http://user:p%40ss@git.local:8080/a/b")).toBe("http://***@git.local:8080/a/b");
    expect(shownRepository("ssh://git:secret@github.com/acme/app.git")).toBe("ssh://git:***@github.com/acme/app.git");
    expect(shownRepository("https://to@ken@github.com/a@b.git")).toBe("https://***@github.com/a@b.git");
    for (const kept of ["ssh://git@github.com/acme/app.git", "git@github.com:acme/app.git", "https://github.com/acme/app.git", "file:///srv/git/app.git"]) {
      expect(shownRepository(kept)).toBe(kept);
    }
  });
});
