/**
 * The deployment rules deploy-queue applies without I/O: deployment status (spec doc 1 section
 * 3.2), list paging (4.5), per-phase logs order (4.5 logs), which branch an undeploy or a scale
 * targets (4.4 scale, 4.5 undeploy), which services a service action targets and the services'
 * runtime status (doc 2 sections 3.6 and 4.10).
 */
import { describe, expect, it } from "vitest";
import { PlatformError } from "@platform/errors";
import type { Action } from "../src/entities/index.ts";
import { deploymentPhases, deploymentStatus, resolvePage } from "../src/domain/deployments.ts";
import { scaleBranch, serviceShapes, serviceTargets, undeployBranch, type BranchState } from "../src/domain/app-actions.ts";
import { FORGOTTEN_AFTER_MS, servicesStatus, type AgentReport } from "../src/domain/services-status.ts";
import { isPastPointOfNoReturn, marksSwapCommit, SWAP_COMMIT_PHASE } from "../src/domain/point-of-no-return.ts";

const now = new Date("2026-11-20T12:00:00Z");
const secondsAgo = (s: number) => new Date(now.getTime() - s * 1000);

/** The refusal a call throws, as the gateway would render it (status and detail). */
function refusal(fn: () => unknown): { status: number; detail: PlatformError["detail"] } {
  try {
    fn();
  } catch (err) {
    if (err instanceof PlatformError) return { status: err.status, detail: err.detail };
    throw err;
  }
  throw new Error("expected a refusal");
}

describe("deployment status (doc 1 section 3.2)", () => {
  const deploy = (status: string, phase: string | null = null) => deploymentStatus({ actionType: "DEPLOY", status, phase });

  it("a queued deployment is queued", () => {
    expect(deploy("queued")).toBe("queued");
  });

  it("an in-flight DEPLOY is setup_in_progress while it fetches, starts and health-checks", () => {
    // A claimed action may not have reported a phase yet: it is setting up all the same.
    for (const phase of [null, "setup", "start", "health_check", "health_check:web"]) expect(deploy("in_progress", phase)).toBe("setup_in_progress");
  });

  it("is ready_to_deploy once its checks passed, in_progress at the swap commit, running while the old colour drains", () => {
    expect(deploy("in_progress", "ready")).toBe("ready_to_deploy");
    expect(deploy("in_progress", SWAP_COMMIT_PHASE)).toBe("in_progress");
    expect(deploy("in_progress", "drain")).toBe("running");
  });

  it("follows the same phases for a RETRY", () => {
    expect(deploymentStatus({ actionType: "RETRY", status: "in_progress", phase: "ready" })).toBe("ready_to_deploy");
  });

  it("an UNDEPLOY accepted (queued) or in flight is undeploying, whatever phase it reports", () => {
    expect(deploymentStatus({ actionType: "UNDEPLOY", status: "in_progress", phase: null })).toBe("undeploying");
    expect(deploymentStatus({ actionType: "UNDEPLOY", status: "in_progress", phase: "drain" })).toBe("undeploying");
    expect(deploymentStatus({ actionType: "UNDEPLOY", status: "queued", phase: null })).toBe("undeploying");
  });

  it("terminal statuses pass through unchanged, for every deployment type", () => {
    for (const actionType of ["DEPLOY", "RETRY", "UNDEPLOY"]) {
      for (const status of ["completed", "failed", "cancelled"]) {
        // A phase left from the run must not leak into a finished deployment's status.
        expect(deploymentStatus({ actionType, status, phase: "drain" })).toBe(status);
      }
    }
  });
});

describe("deployment list paging (doc 1 section 4.5: limit 1-200 default 50, offset default 0)", () => {
  it("defaults to 50 from offset 0; an unset (zero) limit is the default", () => {
    expect(resolvePage(undefined, undefined)).toEqual({ limit: 50, offset: 0 });
    expect(resolvePage(0, undefined)).toEqual({ limit: 50, offset: 0 });
  });

  it("accepts 1 to 200 and any non-negative offset", () => {
    expect(resolvePage(1, 0)).toEqual({ limit: 1, offset: 0 });
    expect(resolvePage(200, 1000)).toEqual({ limit: 200, offset: 1000 });
  });

  it("refuses a limit outside 1-200 or not an integer with 422", () => {
    for (const limit of [201, -1, 2.5, Number.NaN]) {
      expect(refusal(() => resolvePage(limit, 0))).toEqual({ status: 422, detail: "limit must be an integer from 1 to 200." });
    }
  });

  it("refuses a negative or fractional offset with 422", () => {
    for (const offset of [-1, 0.5]) expect(refusal(() => resolvePage(10, offset)).status).toBe(422);
  });
});

describe("deployment logs: per-phase output in phase order (doc 1 section 4.5)", () => {
  const withPhases = (phases: unknown) => ({ result: phases === undefined ? null : { phases } }) as Action;

  it("orders phases setup, start, health_check, ready, swap_committed, drain whatever order they were reported in", () => {
    const out = deploymentPhases(
      withPhases({ drain: "d", ready: "r", [SWAP_COMMIT_PHASE]: "s", health_check: "h", setup: "a", start: "b" }),
    );
    expect(out.map((p) => p.name)).toEqual(["setup", "start", "health_check", "ready", "swap_committed", "drain"]);
    expect(out[0]).toEqual({ name: "setup", output: "a" });
  });

  it("places a per-service phase (health_check:web) with its phase, and unknown phases last", () => {
    const out = deploymentPhases(withPhases({ custom: "x", "health_check:web": "w", setup: "a" }));
    expect(out.map((p) => p.name)).toEqual(["setup", "health_check:web", "custom"]);
  });

  it("is empty when the agent reported no phases, and skips non-text output", () => {
    expect(deploymentPhases(withPhases(undefined))).toEqual([]);
    expect(deploymentPhases(withPhases("not an object"))).toEqual([]);
    expect(deploymentPhases(withPhases({ setup: "a", start: 42 }))).toEqual([{ name: "setup", output: "a" }]);
  });
});

describe("undeploy branch resolution (doc 1 section 4.5)", () => {
  // A branch serves when it has a running version (whatever its deploy_status, rule 4).
  const branch = (name: string, deployStatus: string, isProduction = false, runningVersion?: string): BranchState => ({
    branch: name,
    deployStatus,
    isProduction,
    runningVersion: runningVersion ?? (deployStatus === "undeployed" ? undefined : `${name}-1`),
  });

  it("takes the branch asked for, live or not", () => {
    expect(undeployBranch("shop", [branch("main", "running", true), branch("dev", "undeployed")], "dev")).toBe("dev");
  });

  it("refuses a branch the app does not have with 404", () => {
    const r = refusal(() => undeployBranch("shop", [branch("main", "running", true)], "nope"));
    expect(r.status).toBe(404);
    expect(r.detail).toContain("nope");
  });

  it("with no branch given, picks the one live branch even when it is not production", () => {
    expect(undeployBranch("shop", [branch("main", "undeployed", true), branch("dev", "running")], "")).toBe("dev");
    // A failed deploy still leaves a live branch when its older version serves.
    expect(undeployBranch("shop", [branch("main", "undeployed", true), branch("dev", "failed")], "")).toBe("dev");
  });

  it("does not count a branch whose first deploy failed: nothing serves there", () => {
    const firstFailed: BranchState = { branch: "dev", deployStatus: "failed", isProduction: false };
    expect(undeployBranch("shop", [branch("main", "running", true), firstFailed], "")).toBe("main");
  });

  it("with several live branches, refuses 409 branch_required naming them", () => {
    const r = refusal(() => undeployBranch("shop", [branch("main", "running", true), branch("dev", "deploying"), branch("old", "undeployed")], ""));
    expect(r.status).toBe(409);
    expect(r.detail).toMatchObject({ code: "branch_required", branches: ["main", "dev"] });
    const message = (r.detail as { message: string }).message;
    expect(message).toContain("main");
    expect(message).toContain("dev");
    expect(message).not.toContain("old");
  });

  it("with none live, falls back to the registry's production branch", () => {
    expect(undeployBranch("shop", [branch("dev", "undeployed"), branch("main", "undeployed", true)], "")).toBe("main");
  });

  it("refuses 404 when the app has no branch at all", () => {
    expect(refusal(() => undeployBranch("shop", [], "")).status).toBe(404);
  });
});

describe("scale branch resolution (doc 1 section 4.4: omitted resolves to the running branch, else production)", () => {
  const branches: BranchState[] = [
    { branch: "main", deployStatus: "undeployed", isProduction: true },
    { branch: "dev", deployStatus: "running", isProduction: false, runningVersion: "dev-1" },
  ];

  it("takes the branch asked for", () => {
    expect(scaleBranch(branches, "main")).toBe("main");
  });

  it("prefers the running branch over production", () => {
    expect(scaleBranch(branches, "")).toBe("dev");
  });

  it("falls back to production when nothing runs", () => {
    expect(scaleBranch([{ branch: "dev", deployStatus: "failed", isProduction: false }, branches[0]!], "")).toBe("main");
  });

  it("takes a branch whose newer deploy failed while an older version serves (rule 4)", () => {
    expect(scaleBranch([{ ...branches[1]!, deployStatus: "failed" }, branches[0]!], "")).toBe("dev");
  });
});

describe("service action targets (doc 2 section 4.10)", () => {
  const services = [
    { name: "web", isStatic: false },
    { name: "site", isStatic: true },
    { name: "worker", isStatic: false },
  ];
  const running = new Set(["web", "worker"]);

  it("targets the one named container service", () => {
    expect(serviceTargets("shop", services, "worker", running)).toEqual({ services: ["worker"], skippedStatic: [], skippedNotDeployed: [] });
  });

  it("refuses an undeclared service with 404", () => {
    const r = refusal(() => serviceTargets("shop", services, "ghost", running));
    expect(r.status).toBe(404);
    expect(r.detail).toContain("ghost");
  });

  it("refuses a named static (edge) service with 422", () => {
    const r = refusal(() => serviceTargets("shop", services, "site", running));
    expect(r).toMatchObject({ status: 422, detail: { code: "static_service" } });
  });

  it("an app-level action targets every container service and lists the static ones skipped", () => {
    expect(serviceTargets("shop", services, null, running)).toEqual({ services: ["web", "worker"], skippedStatic: ["site"], skippedNotDeployed: [] });
  });

  it("leaves out a service the running release does not have (saved with save-config, not deployed): 409 by name, skipped and listed app-wide", () => {
    const saved = [...services, { name: "extra", isStatic: false }];
    expect(refusal(() => serviceTargets("shop", saved, "extra", running))).toMatchObject({ status: 409, detail: { code: "service_not_deployed" } });
    expect(serviceTargets("shop", saved, null, running)).toEqual({ services: ["web", "worker"], skippedStatic: ["site"], skippedNotDeployed: ["extra"] });
  });

  it("knows a static app's services by its config and by its registration's latest preflight, a container app's by its config alone", () => {
    expect(serviceShapes({ type: "static", services: {} }, ["site"])).toEqual([{ name: "site", isStatic: true }]);
    const r = refusal(() => serviceTargets("shop", serviceShapes({ type: "static" }, ["site"]), "site", running));
    expect(r).toMatchObject({ status: 422, detail: { code: "static_service" } });
    expect(serviceShapes({ type: "container", services: { web: {} } }, ["web", "worker"])).toEqual([{ name: "web", isStatic: false }]);
  });

  it("refuses an app-level action with 422 when every service is static", () => {
    const r = refusal(() => serviceTargets("shop", [{ name: "site", isStatic: true }], null, running));
    expect(r).toMatchObject({ status: 422, detail: { code: "all_static" } });
  });
});

describe("service runtime status (doc 2 sections 3.6 and 4.10)", () => {
  const target = { groupSlug: "acme", appName: "shop", branch: "main", isStatic: false };
  const running = (service: string, replicas = 1, over: Record<string, unknown> = {}) => ({
    group: "acme",
    app: "shop",
    branch: "main",
    service,
    replicas_running: replicas,
    ...over,
  });
  const agent = (hostId: string, lastSeen: Date, inventory?: unknown[]): AgentReport => ({
    hostId,
    lastSeen,
    facts: inventory === undefined ? {} : { inventory },
  });
  const ctx = (agents: AgentReport[] | null, over: { ambiguous?: boolean; floor?: number } = {}) => ({ agents, ambiguous: false, floor: 1, now, ...over });
  const one = (agents: AgentReport[], t = target) => servicesStatus(t, ["web"], ctx(agents))[0]!;

  it("a static service is edge, with an empty runtime", () => {
    const [view] = servicesStatus({ ...target, isStatic: true }, ["site"], ctx([agent("h1", secondsAgo(5), [])]));
    expect(view).toEqual({ name: "site", status: "edge", runtime: { replicas_running: null, hosts_unverified: null, reason: null }, http_client: null, capability_probed_at: null });
  });

  it("is running when a live host reports a replica; replicas_running counts hosts, not containers", () => {
    const view = one([agent("h1", secondsAgo(5), [running("web", 3)]), agent("h2", secondsAgo(10), [running("web", 2)]), agent("h3", secondsAgo(10), [])]);
    expect(view).toEqual({ name: "web", status: "running", runtime: { replicas_running: 2, hosts_unverified: 0, reason: null }, http_client: null, capability_probed_at: null });
  });

  it("is running on one current report even while another host is silent, which it counts as unverified", () => {
    const view = one([agent("h1", secondsAgo(5), [running("web")]), agent("h2", secondsAgo(120), [])]);
    expect(view).toEqual({ name: "web", status: "running", runtime: { replicas_running: 1, hosts_unverified: 1, reason: null }, http_client: null, capability_probed_at: null });
  });

  it("only counts reports of this group, app, branch and service with a replica up", () => {
    const others = [
      running("web", 1, { branch: "dev" }),
      running("web", 1, { app: "other" }),
      running("web", 1, { group: "globex" }),
      running("worker"),
      running("web", 0),
    ];
    expect(one([agent("h1", secondsAgo(5), others)])).toMatchObject({ status: "not_running", runtime: { replicas_running: 0 } });
  });

  it("is not_running only when every known host is live, sent its inventory and none reports the service", () => {
    const view = one([agent("h1", secondsAgo(5), []), agent("h2", secondsAgo(30), [running("worker")])]);
    expect(view).toEqual({ name: "web", status: "not_running", runtime: { replicas_running: 0, hosts_unverified: 0, reason: null }, http_client: null, capability_probed_at: null });
  });

  it("is unknown with no_alive_agents when no host is live", () => {
    expect(one([])).toMatchObject({ status: "unknown", runtime: { replicas_running: null, hosts_unverified: 0, reason: "no_alive_agents" } });
    // A silent host's last inventory is not a current report.
    const view = one([agent("h1", secondsAgo(61), [running("web")])]);
    expect(view).toEqual({ name: "web", status: "unknown", runtime: { replicas_running: null, hosts_unverified: 1, reason: "no_alive_agents" }, http_client: null, capability_probed_at: null });
  });

  it("is unknown with inventory_stale when a live host sent no inventory", () => {
    const view = one([agent("h1", secondsAgo(5), []), agent("h2", secondsAgo(5))]);
    expect(view).toEqual({ name: "web", status: "unknown", runtime: { replicas_running: 0, hosts_unverified: 0, reason: "inventory_stale" }, http_client: null, capability_probed_at: null });
  });

  it("is unknown with host_silent when a known host is silent (the service may run there unseen)", () => {
    const view = one([agent("h1", secondsAgo(5), []), agent("h2", secondsAgo(600), [])]);
    expect(view).toEqual({ name: "web", status: "unknown", runtime: { replicas_running: 0, hosts_unverified: 1, reason: "host_silent" }, http_client: null, capability_probed_at: null });
  });

  it("is unknown with read_failed when the agents' reports could not be read; a static service stays edge", () => {
    expect(servicesStatus(target, ["web"], ctx(null))[0]).toEqual({
      name: "web",
      status: "unknown",
      runtime: { replicas_running: null, hosts_unverified: null, reason: "read_failed" },
      http_client: null,
      capability_probed_at: null,
    });
    expect(servicesStatus({ ...target, isStatic: true }, ["site"], ctx(null))[0]!.status).toBe("edge");
  });

  it("is unknown with ambiguous_name when the name is an app of several groups and none was chosen, even while a replica runs", () => {
    const [view] = servicesStatus(target, ["web"], ctx([agent("h1", secondsAgo(5), [running("web")])], { ambiguous: true }));
    expect(view).toMatchObject({ status: "unknown", runtime: { reason: "ambiguous_name" } });
    // No live agent says more, and comes first.
    expect(servicesStatus(target, ["web"], ctx([], { ambiguous: true }))[0]!.runtime.reason).toBe("no_alive_agents");
  });

  it("is unknown with fleet_below_floor when fewer hosts are live than the fleet should have and none reports the service", () => {
    const live = [agent("h1", secondsAgo(5), []), agent("h2", secondsAgo(5))];
    expect(servicesStatus(target, ["web"], ctx(live, { floor: 3 }))[0]).toMatchObject({ status: "unknown", runtime: { replicas_running: 0, reason: "fleet_below_floor" } });
    // It comes before inventory_stale; a current report of the service is still running.
    expect(servicesStatus(target, ["web"], ctx([agent("h1", secondsAgo(5), [running("web")])], { floor: 3 }))[0]!.status).toBe("running");
    expect(servicesStatus(target, ["web"], ctx(live, { floor: 2 }))[0]!.runtime.reason).toBe("inventory_stale");
  });

  it("reports inventory_stale before host_silent when both apply", () => {
    expect(one([agent("h1", secondsAgo(5)), agent("h2", secondsAgo(600), [])]).runtime.reason).toBe("inventory_stale");
  });

  it("forgets hosts silent for over 24 hours: they neither make a status unknown nor count as unverified", () => {
    const gone = agent("old", new Date(now.getTime() - FORGOTTEN_AFTER_MS - 1000), []);
    expect(one([agent("h1", secondsAgo(5), []), gone])).toMatchObject({ status: "not_running", runtime: { hosts_unverified: 0, reason: null } });
    // A host silent for just under 24 hours is still known.
    const recent = agent("recent", new Date(now.getTime() - FORGOTTEN_AFTER_MS + 1000), []);
    expect(one([agent("h1", secondsAgo(5), []), recent])).toMatchObject({ status: "unknown", runtime: { hosts_unverified: 1, reason: "host_silent" } });
    // With only forgotten hosts there is no live agent.
    expect(one([gone]).runtime).toEqual({ replicas_running: null, hosts_unverified: 0, reason: "no_alive_agents" });
  });

  it("says which HTTP client a running replica can run, as the latest probe among its hosts found", () => {
    const probed = (client: string, at: string) => ({ http_client: client, capability_probed_at: at });
    const view = one([
      agent("h1", secondsAgo(5), [running("web", 1, probed("node", "2026-11-20T10:00:00.000Z"))]),
      agent("h2", secondsAgo(5), [running("web", 1, probed("curl", "2026-11-20T11:00:00.000Z"))]),
      // Not running the service: what it found does not count.
      agent("h3", secondsAgo(5), [running("web", 0, probed("python3", "2026-11-20T12:00:00.000Z"))]),
    ]);
    expect(view).toMatchObject({ status: "running", http_client: "curl", capability_probed_at: "2026-11-20T11:00:00.000Z" });
    // Nothing probed (a docker host), or a value outside the vocabulary: null, and so is the time.
    expect(one([agent("h1", secondsAgo(5), [running("web", 1, { http_client: null, capability_probed_at: null })])])).toMatchObject({ http_client: null, capability_probed_at: null });
    expect(one([agent("h1", secondsAgo(5), [running("web", 1, probed("wget", "2026-11-20T10:00:00.000Z"))])])).toMatchObject({ http_client: null, capability_probed_at: null });
  });

  it("answers one view per service, in the order asked", () => {
    const views = servicesStatus(target, ["web", "worker"], ctx([agent("h1", secondsAgo(5), [running("worker")])]));
    expect(views.map((v) => [v.name, v.status])).toEqual([
      ["web", "not_running"],
      ["worker", "running"],
    ]);
  });
});

describe("point of no return (doc 1 section 3.2), beyond what domain.test.ts covers", () => {
  it("only the swap-commit phase marks it", () => {
    for (const phase of ["setup", "start", "health_check", "ready", "drain", ""]) expect(marksSwapCommit(phase)).toBe(false);
  });

  it("a RETRY past its swap commit can no longer be cancelled either", () => {
    expect(isPastPointOfNoReturn({ actionType: "RETRY", status: "in_progress", swapCommittedAt: now })).toBe(true);
  });

  it("applies only to an in-flight action: a finished one is not cancellable for other reasons", () => {
    for (const status of ["queued", "completed", "failed", "cancelled"]) {
      expect(isPastPointOfNoReturn({ actionType: "DEPLOY", status, swapCommittedAt: now })).toBe(false);
    }
  });

  it("a single-step action in flight (UNDEPLOY, SERVICE_ACTION, RECONCILE_ROUTING) is past it from its claim; a build in flight is not", () => {
    for (const actionType of ["UNDEPLOY", "SERVICE_ACTION", "RECONCILE_ROUTING"]) {
      expect(isPastPointOfNoReturn({ actionType, status: "in_progress", swapCommittedAt: null })).toBe(true);
      expect(isPastPointOfNoReturn({ actionType, status: "queued", swapCommittedAt: null })).toBe(false);
    }
    expect(isPastPointOfNoReturn({ actionType: "BUILD", status: "in_progress", swapCommittedAt: null })).toBe(false);
  });
});
