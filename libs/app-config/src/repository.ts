/**
 * Which repository URLs an app may be registered with and an agent may hand to git
 * (ARCHITECTURE section 8): `https://`, `http://`, `ssh://`, `user@host:path`, and `file://`
 * only where file repositories are allowed. Anything else (a bare path, `git://`, `ext::`, a
 * value git could take for an option) is refused before git sees it. apps-builds refuses it at
 * registration with the spec's 422, and the agent refuses it again before every clone, so a row
 * written before a rule was tightened never reaches git either.
 */
export type RepositoryKind = "https" | "http" | "ssh" | "scp" | "file";

export const MAX_REPOSITORY_LENGTH = 2048;

export const SCP_LIKE_REPOSITORY = /^([A-Za-z0-9._~-]+@)([A-Za-z0-9][A-Za-z0-9.-]*):(?!\/\/)([^\s]+)$/;

export type RepositoryCheck =
  | { ok: true; kind: RepositoryKind }
  | { ok: false; reason: "repository_unsupported" | "file_repository_not_allowed"; detail: string };

export function checkRepositoryUrl(repository: string, allowFileRepos: boolean): RepositoryCheck {
  const unsupported = {
    ok: false as const,
    reason: "repository_unsupported" as const,
    detail: "Repository host unsupported: use an https://, http://, ssh:// or git@host:path URL.",
  };
  // A control character, written or percent-encoded, names no repository any git host serves;
  // nothing may start with "-", which git would read as an option.
  if (
    repository === "" ||
    repository.length > MAX_REPOSITORY_LENGTH ||
    /[\s\x00-\x1f\x7f]|%(?:[01][0-9a-f]|7f)/i.test(repository) ||
    repository.startsWith("-")
  ) {
    return unsupported;
  }
  if (SCP_LIKE_REPOSITORY.test(repository)) return { ok: true, kind: "scp" };
  let url: URL;
  try {
    url = new URL(repository);
  } catch {
    return unsupported;
  }
  switch (url.protocol) {
    case "https:":
    case "http:":
    case "ssh:":
      if (!url.hostname || url.hostname.startsWith("-") || url.username.startsWith("-")) return unsupported;
      return { ok: true, kind: url.protocol.slice(0, -1) as "https" | "http" | "ssh" };
    case "file:":
      if (!allowFileRepos) {
        return {
          ok: false,
          reason: "file_repository_not_allowed",
          detail: "file:// repositories are accepted only when PLATFORM_ALLOW_FILE_REPOS is true on the agent.",
        };
      }
      if ((url.hostname !== "" && url.hostname !== "localhost") || url.pathname === "/" || url.pathname === "") return unsupported;
      return { ok: true, kind: "file" };
    default:
      return unsupported;
  }
}

/**
 * The repository URL as shown back: an https or http URL's user part (a token, or a user and
 * password) becomes `***`, and an ssh URL's password does. The stored URL keeps them, since the
 * agents clone with it; read-scope keys and error messages never see them.
 */
export function shownRepository(repository: string): string {
  if (!/^(https?|ssh):\/\//i.test(repository)) return repository;
  let url: URL;
  try {
    url = new URL(repository);
  } catch {
    return repository;
  }
  if (!url.username && !url.password) return repository;
  const start = repository.indexOf("//") + 2;
  // The user part ends at the authority's last "@" (the URL parser reads "a@b@host" so too).
  const end = repository.slice(start).search(/[/?#]/);
  const at = repository.lastIndexOf("@", end < 0 ? repository.length : start + end);
  const scheme = repository.slice(0, start);
  const user = url.protocol === "ssh:" ? `${url.username}${url.password ? ":***" : ""}` : "***";
  return `${scheme}${user}${repository.slice(at)}`;
}
