/** The queue's rules with no I/O: admission gates, stuck_class, placement, lifecycle names, limits. */
import { describe, expect, it } from "vitest";
import { admitForceAvailable, checkAdmission, type AdmissionInput } from "../src/domain/admission.ts";
import { clampTtl } from "../src/domain/admit-force.ts";
import { isLive, validHostId } from "../src/domain/agents.ts";
import { isUuid, parseBuildRequested } from "@platform/bus";
import { isTerminal, queueStatus } from "../src/domain/lifecycle.ts";
import { checkActionIdPrefix } from "../src/domain/lookup.ts";
import { choosePlacement, workSubject } from "../src/domain/placement.ts";
import { isPastPointOfNoReturn, SWAP_COMMIT_PHASE, marksSwapCommit } from "../src/domain/point-of-no-return.ts";
import { pruneCutoff } from "../src/domain/pruning.ts";
import { normalizeTypes, resolveLimit } from "../src/domain/queue.ts";
import { checkStaticSiteFields, requestedServices } from "../src/domain/deployments.ts";
import { stuckClass } from "../src/domain/stuck.ts";
import { ANNOUNCED_RESULT_MAX_BYTES, announcedResult } from "../src/domain/events.ts";

const now = new Date("2026-11-20T12:00:00Z");
const secondsAgo = (s: number) => new Date(now.getTime() - s * 1000);
const BUILD = "11111111-1111-4111-8111-111111111111";
const DEPLOY = "22222222-2222-4222-8222-222222222222";

function input(overrides: Omit<Partial<AdmissionInput>, "action"> & { action?: Partial<AdmissionInput["action"]> } = {}): AdmissionInput {
  const { action, ...rest } = overrides;
  return {
    action: { id: DEPLOY, status: "queued", actionType: "BUILD", claimedBy: null, dependsOn: null, admitForceUntil: null, admitForceUsed: false, ...action },
    hostId: "h1",
    dependency: null,
    supersededBy: null,
    appLaneBusyWith: null,
    appLaneAhead: null,
    buildInFlight: null,
    inFlightOnHost: 0,
    waitingAhead: [],
    now,
    ...rest,
  };
}

describe("admission gates", () => {
  it("admits a queued action with nothing in its way", () => {
    expect(checkAdmission(input())).toEqual({ verdict: "admit", forced: false });
  });

  it("holds an undeploy with purge back while a build of its branch is in flight, naming it", () => {
    expect(checkAdmission(input({ action: { actionType: "UNDEPLOY" }, buildInFlight: BUILD }))).toEqual({
      verdict: "refuse",
      reason: "waiting for build 11111111 of the branch to end: a purge deletes its image and record too",
      blockingActionId: BUILD,
    });
  });

  it("drops a terminal action and one claimed by another host; resumes on the same host", () => {
    expect(checkAdmission(input({ action: { status: "completed" } }))).toMatchObject({ verdict: "drop", reason: "action is completed" });
    expect(checkAdmission(input({ action: { status: "in_progress", claimedBy: "h2" } }))).toMatchObject({ verdict: "drop", reason: "claimed by host h2" });
    expect(checkAdmission(input({ action: { status: "in_progress", claimedBy: "h1" } }))).toEqual({ verdict: "resume" });
  });

  it("refuses until the dependency completed, naming it and its status", () => {
    for (const status of ["queued", "in_progress"]) {
      const r = checkAdmission(input({ action: { actionType: "DEPLOY", dependsOn: BUILD }, dependency: { id: BUILD, actionType: "BUILD", status } }));
      expect(r).toEqual({ verdict: "refuse", reason: `waiting for ${BUILD} (${status})`, blockingActionId: BUILD });
    }
    const done = checkAdmission(input({ action: { actionType: "DEPLOY", dependsOn: BUILD }, dependency: { id: BUILD, actionType: "BUILD", status: "completed" } }));
    expect(done).toEqual({ verdict: "admit", forced: false });
  });

  it("ends the action with a failed or cancelled dependency, or a vanished one", () => {
    const failed = checkAdmission(input({ action: { dependsOn: BUILD }, dependency: { id: BUILD, actionType: "BUILD", status: "failed" } }));
    expect(failed).toMatchObject({ verdict: "abandon", status: "failed" });
    const cancelled = checkAdmission(input({ action: { dependsOn: BUILD }, dependency: { id: BUILD, actionType: "BUILD", status: "cancelled" } }));
    expect(cancelled).toMatchObject({ verdict: "abandon", status: "cancelled" });
    expect(checkAdmission(input({ action: { dependsOn: BUILD }, dependency: null }))).toMatchObject({ verdict: "abandon", status: "failed" });
  });

  it("cancels the deploy of a build once the deploy of a build or an undeploy requested after it has started", () => {
    const built = { id: BUILD, actionType: "BUILD", status: "completed" };
    const newer = { id: "33333333-3333-4333-8333-333333333333", imageTag: "main-0000000b", actionType: "DEPLOY" };
    const r = checkAdmission(input({ action: { actionType: "DEPLOY", dependsOn: BUILD, admitForceUntil: secondsAgo(-60) }, dependency: built, supersededBy: newer }));
    expect(r).toMatchObject({ verdict: "abandon", status: "cancelled" });
    expect(r.verdict === "abandon" && r.reason).toMatch(/Superseded: the deploy 33333333-.* of a build requested after this one \(main-0000000b\)/);
    // Its build must still have completed first: a failed build fails its deploy, as always.
    const failed = checkAdmission(input({ action: { actionType: "DEPLOY", dependsOn: BUILD }, dependency: { ...built, status: "failed" }, supersededBy: newer }));
    expect(failed).toMatchObject({ verdict: "abandon", status: "failed" });
    // An undeploy requested after it that has started: the build must not bring the app back.
    const undeploy = { id: "44444444-4444-4444-8444-444444444444", imageTag: null, actionType: "UNDEPLOY" };
    const gone = checkAdmission(input({ action: { actionType: "DEPLOY", dependsOn: BUILD }, dependency: built, supersededBy: undeploy }));
    expect(gone).toMatchObject({ verdict: "abandon", status: "cancelled" });
    expect(gone.verdict === "abandon" && gone.reason).toBe("Superseded: the undeploy 44444444-4444-4444-8444-444444444444 requested after this one has already started.");
  });

  it("keeps one change per app lane at a time, and admit-force does not pass it", () => {
    const busy = { id: BUILD, actionType: "DEPLOY" };
    const r = checkAdmission(input({ action: { actionType: "DEPLOY", admitForceUntil: secondsAgo(-60) }, appLaneBusyWith: busy }));
    expect(r).toMatchObject({ verdict: "refuse", blockingActionId: BUILD });
    // A route reconcile does not wait for the deploy: a flip to private holds within seconds.
    expect(checkAdmission(input({ action: { actionType: "RECONCILE_ROUTING" }, appLaneBusyWith: busy }))).toMatchObject({ verdict: "admit" });
    // BUILDs are not in the app lane.
    expect(checkAdmission(input({ appLaneBusyWith: busy }))).toMatchObject({ verdict: "admit" });
  });

  it("keeps an app lane in order: a ready action ahead of it goes first, admit-force or not", () => {
    const r = checkAdmission(input({ action: { actionType: "SERVICE_ACTION", admitForceUntil: secondsAgo(-60) }, appLaneAhead: BUILD }));
    expect(r).toMatchObject({ verdict: "refuse", blockingActionId: BUILD });
    expect((r as { reason: string }).reason).toMatch(/waiting behind 11111111 .* same app and branch/);
    expect(checkAdmission(input({ action: { actionType: "SERVICE_ACTION" } }))).toMatchObject({ verdict: "admit" });
    // BUILDs are not in the app lane.
    expect(checkAdmission(input({ appLaneAhead: BUILD }))).toMatchObject({ verdict: "admit" });
  });

  it("limits in-flight BUILDs per host; admit-force passes the gate once", () => {
    const full = input({ inFlightOnHost: 2 });
    expect(checkAdmission(full)).toMatchObject({ verdict: "refuse", reason: expect.stringContaining("limit of 2 BUILD") });
    const granted = input({ inFlightOnHost: 2, action: { admitForceUntil: secondsAgo(-60) } });
    expect(checkAdmission(granted)).toEqual({ verdict: "admit", forced: true });
    const used = input({ inFlightOnHost: 2, action: { admitForceUntil: secondsAgo(-60), admitForceUsed: true } });
    expect(checkAdmission(used).verdict).toBe("refuse");
    const expired = input({ inFlightOnHost: 2, action: { admitForceUntil: secondsAgo(1) } });
    expect(checkAdmission(expired).verdict).toBe("refuse");
  });

  it("does not spend a grant when the gates would admit anyway", () => {
    expect(checkAdmission(input({ action: { admitForceUntil: secondsAgo(-60) } }))).toEqual({ verdict: "admit", forced: false });
  });

  it("lets higher-priority or older ready actions take the free slots first", () => {
    expect(checkAdmission(input({ inFlightOnHost: 1, waitingAhead: [BUILD] }))).toMatchObject({ verdict: "refuse", blockingActionId: BUILD });
    expect(checkAdmission(input({ inFlightOnHost: 0, waitingAhead: [BUILD] }))).toMatchObject({ verdict: "admit" });
  });

  it("knows a grant's validity", () => {
    expect(admitForceAvailable({ admitForceUntil: secondsAgo(-1), admitForceUsed: false }, now)).toBe(true);
    expect(admitForceAvailable({ admitForceUntil: null, admitForceUsed: false }, now)).toBe(false);
  });
});

describe("stuck_class", () => {
  const base = { status: "queued", dependsOn: null, admissionCheckReason: null, lastAdmissionCheckAt: null, createdAt: secondsAgo(10), claimedAt: null, progressAt: null };

  it("is null for a fresh queued action and for terminal ones", () => {
    expect(stuckClass(base, null, now)).toBeNull();
    expect(stuckClass({ ...base, status: "failed", createdAt: secondsAgo(9999) }, null, now)).toBeNull();
  });

  it("never_claimed: queued over 2 minutes with no admission check", () => {
    expect(stuckClass({ ...base, createdAt: secondsAgo(121) }, null, now)).toBe("never_claimed");
    expect(stuckClass({ ...base, createdAt: secondsAgo(121), lastAdmissionCheckAt: secondsAgo(5) }, null, now)).toBeNull();
  });

  it("admission_refused: queued with a refusal reason", () => {
    expect(stuckClass({ ...base, admissionCheckReason: "host h1 is at its limit", lastAdmissionCheckAt: secondsAgo(1) }, null, now)).toBe("admission_refused");
  });

  it("build_in_progress: waiting on a dependency that is still live, before any refusal", () => {
    const deploy = { ...base, dependsOn: BUILD, admissionCheckReason: `waiting for ${BUILD} (in_progress)` };
    expect(stuckClass(deploy, "in_progress", now)).toBe("build_in_progress");
    expect(stuckClass(deploy, "queued", now)).toBe("build_in_progress");
    expect(stuckClass(deploy, "completed", now)).toBe("admission_refused");
  });

  it("in_progress: claimed with no progress for over 2 minutes", () => {
    const claimed = { ...base, status: "in_progress", claimedAt: secondsAgo(3600) };
    expect(stuckClass({ ...claimed, progressAt: secondsAgo(121) }, null, now)).toBe("in_progress");
    expect(stuckClass({ ...claimed, progressAt: secondsAgo(30) }, null, now)).toBeNull();
  });

  it("in_progress sooner when the claiming host has gone silent too: no report and no heartbeat for over a minute", () => {
    const claimed = { ...base, status: "in_progress", claimedAt: secondsAgo(3600) };
    expect(stuckClass({ ...claimed, progressAt: secondsAgo(61) }, null, now, secondsAgo(61))).toBe("in_progress");
    // A live host, or a report within the minute, is still waited on.
    expect(stuckClass({ ...claimed, progressAt: secondsAgo(61) }, null, now, secondsAgo(5))).toBeNull();
    expect(stuckClass({ ...claimed, progressAt: secondsAgo(30) }, null, now, secondsAgo(90))).toBeNull();
    expect(stuckClass({ ...claimed, progressAt: secondsAgo(61) }, null, now, null)).toBeNull();
  });
});

describe("placement", () => {
  const agent = (hostId: string, inFlight: number, extra: Partial<{ lastSeen: Date; schedulable: boolean; assigned: number }> = {}) => ({
    hostId,
    lastSeen: secondsAgo(5),
    schedulable: true,
    inFlight,
    assigned: 0,
    ...extra,
  });

  it("picks the live, schedulable agent with the fewest in-flight actions, ties by host_id", () => {
    expect(choosePlacement([agent("b", 1), agent("a", 1), agent("c", 0)], now)).toBe("c");
    expect(choosePlacement([agent("b", 1), agent("a", 1)], now)).toBe("a");
    expect(choosePlacement([agent("a", 0, { assigned: 3 }), agent("b", 0)], now)).toBe("b");
  });

  it("skips silent and unschedulable agents; none live means work.any", () => {
    expect(choosePlacement([agent("a", 0, { lastSeen: secondsAgo(61) }), agent("b", 5)], now)).toBe("b");
    expect(choosePlacement([agent("a", 0, { schedulable: false })], now)).toBeNull();
    expect(workSubject(null)).toBe("work.any");
    expect(workSubject("h1")).toBe("work.host.h1");
  });

  it("keeps a dependent on its dependency's host when that host is live", () => {
    expect(choosePlacement([agent("a", 0), agent("b", 3)], now, "b")).toBe("b");
    expect(choosePlacement([agent("a", 0), agent("b", 3, { lastSeen: secondsAgo(90) })], now, "b")).toBe("a");
  });

  it("calls an agent live for 60 seconds after its heartbeat", () => {
    expect(isLive(secondsAgo(60), now)).toBe(true);
    expect(isLive(secondsAgo(61), now)).toBe(false);
    expect(validHostId("host-1")).toBe(true);
    expect(validHostId("any")).toBe(false);
    expect(validHostId("a.b")).toBe(false);
  });
});

describe("lifecycle and limits", () => {
  it("names BUILD states with the live lifecycle names", () => {
    const names = ["queued", "in_progress", "completed", "failed", "cancelled"].map((status) => queueStatus({ actionType: "BUILD", status }));
    expect(names).toEqual(["queued", "build_in_progress", "build_completed", "build_failed", "build_cancelled"]);
    expect(queueStatus({ actionType: "DEPLOY", status: "in_progress" })).toBe("in_progress");
    expect(isTerminal("cancelled")).toBe(true);
    expect(isTerminal("in_progress")).toBe(false);
  });

  it("clamps the admit-force TTL to 60-3600 s, default 300", () => {
    expect([clampTtl(0), clampTtl(-5), clampTtl(undefined), clampTtl(10), clampTtl(600), clampTtl(99999)]).toEqual([60, 60, 300, 60, 600, 3600]);
  });

  it("accepts queue limits 1-500, default 100", () => {
    expect(resolveLimit(0)).toBe(100);
    expect(resolveLimit(500)).toBe(500);
    expect(() => resolveLimit(501)).toThrow(/between 1 and 500/);
    expect(() => resolveLimit(-1)).toThrow(/between 1 and 500/);
  });

  it("reads exclude_types as comma lists, case-insensitively", () => {
    expect(normalizeTypes(["build, deploy", "EXEC", ""])).toEqual(["BUILD", "DEPLOY", "EXEC"]);
  });

  it("wants id prefixes of at least 8 hex-or-hyphen characters", () => {
    expect(checkActionIdPrefix("ABCDEF12")).toBe("abcdef12");
    expect(() => checkActionIdPrefix("abcdef1")).toThrow(/at least 8/);
    expect(() => checkActionIdPrefix("abcdef1%")).toThrow(/hex digits and hyphens only/);
    expect(() => checkActionIdPrefix("ghijklmn")).toThrow(/hex digits and hyphens only/);
  });

  it("places the point of no return at the swap commit of a deploy", () => {
    expect(marksSwapCommit(SWAP_COMMIT_PHASE)).toBe(true);
    expect(isPastPointOfNoReturn({ actionType: "DEPLOY", status: "in_progress", swapCommittedAt: now })).toBe(true);
    expect(isPastPointOfNoReturn({ actionType: "DEPLOY", status: "in_progress", swapCommittedAt: null })).toBe(false);
    expect(isPastPointOfNoReturn({ actionType: "BUILD", status: "in_progress", swapCommittedAt: now })).toBe(false);
  });

  it("prunes what finished more than 30 days ago", () => {
    expect(pruneCutoff(now).toISOString()).toBe("2026-10-21T12:00:00.000Z");
  });

  it("checks the build_requested event's shape", () => {
    const ok = parseBuildRequested({ build_id: BUILD, deploy_action_id: null, app_name: "a", branch: "main", group_slug: "g", tag: "main-1", repository: "r", config_path: "", auto_deploy: false, created_by: "x" });
    expect(ok).toMatchObject({ config_path: "platform.yaml", commit_message: null, auto_deploy: false });
    expect(() => parseBuildRequested({ ...ok, build_id: "nope" })).toThrow(/build_id/);
    expect(() => parseBuildRequested({ ...ok, app_name: "" })).toThrow(/app_name/);
    expect(isUuid(BUILD)).toBe(true);
  });
});

describe("the services a deployment names", () => {
  const config = JSON.stringify({ type: "container", services: { web: {}, worker: {} } });
  it("takes declared names once each; none named is every service", () => {
    expect(requestedServices(["web", " web ", "worker"], config)).toEqual(["web", "worker"]);
    expect(requestedServices(undefined, config)).toBeNull();
    expect(requestedServices([], config)).toBeNull();
  });

  it("refuses what is not a name, and a name the release does not declare, with 400", () => {
    for (const bad of ["web", [123], [{ x: 1 }], [""]]) expect(() => requestedServices(bad, config), JSON.stringify(bad)).toThrow(/list of service names/);
    try {
      requestedServices(["web", "nope"], config);
      expect.unreachable();
    } catch (err) {
      expect(err).toMatchObject({ status: 400, detail: { code: "service_not_declared", services: ["nope"] } });
    }
  });
});

describe("the static-site settings of a deployment", () => {
  it("are taken for a type: static app and refused with 400 for any other, naming them", () => {
    expect(() => checkStaticSiteFields(["aliases"], JSON.stringify({ type: "static", static: { dir: "dist" } }), "site")).not.toThrow();
    expect(() => checkStaticSiteFields([], JSON.stringify({ type: "container" }), "web")).not.toThrow();
    try {
      checkStaticSiteFields(["aliases", "spa_fallback"], JSON.stringify({ services: { web: {} } }), "web");
      expect.unreachable();
    } catch (err) {
      expect(err).toMatchObject({ status: 400, detail: { code: "static_site_fields", fields: ["aliases", "spa_fallback"] } });
      expect((err as { detail: { message: string } }).detail.message).toBe("'aliases', 'spa_fallback' apply to type: static apps only; 'web' is a container app.");
    }
  });
});

describe("the result an action_updated event carries", () => {
  it("keeps what apps-builds reads and leaves the rest in the queue row", () => {
    const result = { commit_hash: "abc", images: ["agent://h/web:main-1"], log: "ok", phases: { clone: "x" }, env_vars_snapshot: { A: "1" }, purge: true };
    expect(announcedResult(result)).toEqual({ commit_hash: "abc", images: ["agent://h/web:main-1"], log: "ok", purge: true });
    expect(announcedResult(null)).toBeNull();
  });

  it("cuts a long log and long crash lines until the event fits in one bus message", () => {
    const line = "x".repeat(80);
    const log = `${Array.from({ length: 30_000 }, (_, i) => `${i} ${line}`).join("\n")}\n\u001b[31mdone\u001b[0m`;
    const crash = Array.from({ length: 30 }, () => "\"".repeat(64 * 1024));
    const result = { commit_message: "fix", log, crash_output: { web: crash }, env_vars_snapshot: { BIG: "v".repeat(16 * 1024 * 1024) } };
    const announced = announcedResult(result)!;
    expect(Buffer.byteLength(JSON.stringify(announced))).toBeLessThanOrEqual(ANNOUNCED_RESULT_MAX_BYTES);
    expect(announced.commit_message).toBe("fix");
    expect(announced.env_vars_snapshot).toBeUndefined();
    const kept = announced.log as string;
    expect(log.startsWith(kept.slice(0, kept.lastIndexOf("\n[cut: ")))).toBe(true);
    // However many times it was halved, the note counts every character cut.
    const cutAt = kept.lastIndexOf("\n[cut: ");
    expect(kept.slice(cutAt)).toBe(`\n[cut: ${log.length - cutAt} more characters]`);
    expect((announced.crash_output as { web: string[] }).web).toHaveLength(30);
    // The action's own result is untouched.
    expect(result.log).toBe(log);
  });

  it("never cuts between the halves of a surrogate pair", () => {
    // Each pair's high half sits at an odd index, where the first halving would cut.
    const announced = announcedResult({ log: `a${"😀".repeat(200_000)}` })!;
    const kept = (announced.log as string).split("\n[cut: ")[0]!;
    expect(kept).toBe(`a${"😀".repeat((kept.length - 1) / 2)}`);
  });
});
