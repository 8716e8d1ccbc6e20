/**
 * Which branch and which services an app-level action targets (spec doc 1 section 4.5 undeploy,
 * doc 2 section 4.10 services). Pure rules over what apps-builds reports of the app.
 */
import { PlatformError } from "@platform/errors";

export interface BranchState {
  branch: string;
  isProduction: boolean;
  deployStatus: string;
  /** The tag serving there; absent when nothing serves (a failed first deploy serves nothing). */
  runningVersion?: string;
}

/** Something serves on the branch: it has a running version (rule 4: `failed` may still serve). */
function serving(b: BranchState): boolean {
  return !!b.runningVersion && b.deployStatus !== "undeployed";
}

/**
 * Undeploy's branch: the one asked for; else the live branch (several live: 409 naming one to
 * choose); none live: the registry's production branch.
 */
export function undeployBranch(appName: string, branches: BranchState[], requested: string): string {
  if (requested) {
    if (!branches.some((b) => b.branch === requested)) throw PlatformError.notFound(`App '${appName}' has no branch '${requested}'`);
    return requested;
  }
  const live = branches.filter(serving);
  if (live.length === 1) return live[0]!.branch;
  if (live.length > 1) {
    throw PlatformError.conflict({
      code: "branch_required",
      message: `App '${appName}' runs on ${live.length} branches (${live.map((b) => b.branch).join(", ")}); name one with "branch", e.g. "${live[0]!.branch}".`,
      branches: live.map((b) => b.branch),
    });
  }
  const production = branches.find((b) => b.isProduction) ?? branches[0];
  if (!production) throw PlatformError.notFound(`App '${appName}' not found`);
  return production.branch;
}

export interface ServiceShape {
  name: string;
  /** `edge`: a static service (no containers). */
  isStatic: boolean;
}

/**
 * The services an action may name: those of the config the app runs (or would build with). A
 * static app also has those its registration lists from the latest preflight, which the status
 * route shows as `edge`: a service added to its repository since its last build is refused as
 * static (422), not as undeclared (404).
 */
export function serviceShapes(config: { type?: string; services?: Record<string, unknown> }, listed: string[]): ServiceShape[] {
  const isStatic = config.type === "static";
  const names = new Set(Object.keys(config.services ?? {}));
  if (isStatic) for (const name of listed) names.add(name);
  return [...names].map((name) => ({ name, isStatic }));
}

export interface ServiceTargets {
  services: string[];
  skippedStatic: string[];
  skippedNotDeployed: string[];
}

/**
 * A service action's targets: one named service (404 undeclared, 422 static, 409 when the serving
 * release does not run it: a service saved with save-config runs once a deploy ships it) or every
 * container service the serving release runs (422 when all are static). `deployed` is null while
 * nothing serves: the caller then refuses with nothing_running, once the service is known declared.
 */
export function serviceTargets(appName: string, services: ServiceShape[], named: string | null, deployed: ReadonlySet<string> | null): ServiceTargets {
  if (named) {
    const s = services.find((x) => x.name === named);
    if (!s) throw PlatformError.notFound(`App '${appName}' declares no service '${named}'`);
    if (s.isStatic) {
      throw PlatformError.invalid({ code: "static_service", message: `Service '${named}' is static (served from the edge): it has no process to start, stop or restart.` });
    }
    if (deployed && !deployed.has(named)) {
      throw PlatformError.conflict({
        code: "service_not_deployed",
        message: `Service '${named}' of '${appName}' is in the saved config but not in the release that runs: deploy the branch to run it.`,
      });
    }
    return { services: [named], skippedStatic: [], skippedNotDeployed: [] };
  }
  const containers = services.filter((s) => !s.isStatic).map((s) => s.name);
  const skippedStatic = services.filter((s) => s.isStatic).map((s) => s.name);
  if (containers.length === 0) {
    throw PlatformError.invalid({ code: "all_static", message: `Every service of '${appName}' is static (served from the edge): nothing to start, stop or restart.` });
  }
  if (!deployed) return { services: containers, skippedStatic, skippedNotDeployed: [] };
  return { services: containers.filter((n) => deployed.has(n)), skippedStatic, skippedNotDeployed: containers.filter((n) => !deployed.has(n)) };
}

/** Actions that change what containers run: a scale waits for none of them to be in flight. */
export const CONTAINER_ACTION_TYPES = ["DEPLOY", "RETRY", "UNDEPLOY", "SERVICE_ACTION"] as const;

/** Scale's branch: the one asked for, else the running one, else production. */
export function scaleBranch(branches: BranchState[], requested: string): string {
  if (requested) return requested;
  return (branches.find(serving) ?? branches.find((b) => b.isProduction) ?? branches[0])?.branch ?? "";
}
