/**
 * Repository URLs (ARCHITECTURE section 8): https, http, ssh and `git@host:path` are accepted,
 * file:// only where the environment allows local repositories; anything else is the spec's
 * 422 "repository host unsupported". The normalised form decides the same-repository rule.
 */
import { checkRepositoryUrl, MAX_REPOSITORY_LENGTH, SCP_LIKE_REPOSITORY } from "@platform/app-config";
import { PlatformError } from "@platform/errors";

export interface RepositoryPolicy {
  allowFileRepos: boolean;
}

function unsupported(repository: string, policy?: RepositoryPolicy): PlatformError {
  return PlatformError.invalid({
    code: "repository_host_unsupported",
    message: `Repository host unsupported: '${repository}'. Use an https://, http://, ssh://${policy?.allowFileRepos ? ", file://" : ""} or git@host:path URL.`,
  });
}

/** Throws the 422 unless the URL is one the agents will clone: the rule they check again before git. */
export function checkRepository(repository: string, policy: RepositoryPolicy): void {
  if (repository.trim().length > MAX_REPOSITORY_LENGTH) {
    throw PlatformError.invalid({ code: "out_of_range", message: `repository must be at most ${MAX_REPOSITORY_LENGTH} characters.` });
  }
  if (!checkRepositoryUrl(repository.trim(), policy.allowFileRepos).ok) throw unsupported(repository, policy);
}

/**
 * `https://GitHub.com/Acme/Web.git/`, `ssh://git@github.com:22/acme/web` and
 * `git@github.com:acme/web.git` all normalise to `github.com/acme/web`, and so does
 * `https://www.github.com/acme/web`: a `www.` host serves the same repositories as the host
 * itself. What is no URL at all is the 422 of `checkRepository`.
 */
export function normalizeRepository(repository: string): string {
  const value = repository.trim();
  const scp = !value.includes("://") ? SCP_LIKE_REPOSITORY.exec(value) : null;
  let host: string;
  let path: string;
  if (scp) {
    host = scp[2]!;
    path = scp[3]!;
  } else {
    let url: URL;
    try {
      url = new URL(value);
      path = decodeURIComponent(url.pathname);
    } catch {
      throw unsupported(repository);
    }
    // ssh's own port is no part of which repository it is (https's and http's the URL drops itself).
    host = url.protocol === "file:" ? "file" : url.protocol === "ssh:" && url.port === "22" ? url.hostname : url.host;
  }
  // Git hosts read `a//b` as `a/b`: one repository, however many slashes.
  path = path.replace(/\/{2,}/g, "/").replace(/\/+$/, "").replace(/\.git$/i, "").replace(/^\/+/, "");
  return `${host.toLowerCase().replace(/^www\./, "")}/${path.toLowerCase()}`;
}
