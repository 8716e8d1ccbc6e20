/**
 * Diagnose (spec doc 1 section 4.5): a read-only narrative on why an action is, or is not,
 * moving: its state, where it was dispatched, the admission gate state (the gates are evaluated
 * as a dry run for the host it waits on), its dependency, an older action blocking it, and one
 * hint. Nothing is written.
 */
import { canSeeGroup, type Caller } from "@platform/caller";
import type { EntityManager } from "@platform/db";
import { Action, Agent } from "../entities/index.ts";
import { admitForceAvailable, checkAdmission } from "./admission.ts";
import { isLive } from "./agents.ts";
import { admissionInput } from "./claims.ts";
import { FAST_RPC_TYPES } from "./lifecycle.ts";
import { getVisibleAction } from "./lookup.ts";
import { withStuckClass, type ActionView } from "./queue.ts";
import { orphanWait } from "./orphans.ts";

export interface Diagnosis {
  view: ActionView;
  narrative: string;
  hint: string;
  blockingActionId: string | null;
}

/** Text ended as a sentence: a message that already ends with its own full stop gets no second one. */
function sentence(text: string): string {
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

function ago(from: Date, now: Date): string {
  const s = Math.max(0, Math.round((now.getTime() - from.getTime()) / 1000));
  if (s < 90) return `${s} s ago`;
  const m = Math.round(s / 60);
  if (m < 90) return `${m} min ago`;
  const h = Math.round(m / 60);
  return h < 48 ? `${h} h ago` : `${Math.round(h / 24)} days ago`;
}

/** `orphanedAfterMs`: how long an action of a silent agent waits before it fails (ORPHANED_ACTION_AFTER_S). */
export async function diagnoseAction(em: EntityManager, caller: Caller, id: string, now: Date, orphanedAfterMs: number): Promise<Diagnosis> {
  const action = await getVisibleAction(em, caller, id);
  const [view] = await withStuckClass(em, [action], now);
  const dependency = action.dependsOn ? await em.findOne(Action, { id: action.dependsOn }) : null;
  const liveAgents = (await em.find(Agent, {})).filter((a) => a.schedulable && isLive(a.lastSeen, now));
  const host = action.dispatchedTo ? await em.findOne(Agent, { hostId: action.dispatchedTo }) : null;
  const lines: string[] = [];
  let hint: string;
  let blocking: Action | null = null;
  const name = `${action.actionType} ${action.id} of ${action.appName} (branch ${action.branch})`;

  switch (action.status) {
    case "completed":
      lines.push(`${name} completed ${ago(action.completedAt ?? action.updatedAt, now)}.`);
      hint = "Nothing to do: the action completed.";
      break;
    case "failed":
      lines.push(sentence(`${name} failed ${ago(action.completedAt ?? action.updatedAt, now)}: ${action.errorMessage ?? "no error message was reported"}`));
      hint = `Read the error and the logs (GET /api/logs?action_id=${action.id}), fix the cause, then trigger it again.`;
      break;
    case "cancelled":
      lines.push(sentence(`${name} was cancelled ${ago(action.completedAt ?? action.updatedAt, now)}${action.errorMessage ? `: ${action.errorMessage}` : ""}`));
      hint = "It was cancelled; trigger it again if it is still wanted.";
      break;
    case "in_progress": {
      const last = action.progressAt ?? action.claimedAt ?? action.createdAt;
      lines.push(`${name} is in progress on host ${action.claimedBy}, claimed ${ago(action.claimedAt ?? action.createdAt, now)}; ${action.phase ? `phase '${action.phase}', ` : ""}last report ${ago(last, now)}.`);
      const claimer = action.claimedBy ? await em.findOne(Agent, { hostId: action.claimedBy }) : null;
      if (claimer && !isLive(claimer.lastSeen, now)) lines.push(`Host ${claimer.hostId} has been silent since ${ago(claimer.lastSeen, now)}.`);
      if (action.swapCommittedAt) lines.push(`It passed the swap commit ${ago(action.swapCommittedAt, now)}: it rolls forward and can no longer be cancelled.`);
      if (action.cancelRequested) {
        lines.push("A cancel was requested: the agent stops at its next phase and completes it as cancelled.");
        hint = `Wait for the agent on host ${action.claimedBy} to stop; if it reports nothing, check that host's agent.`;
      } else if (view!.stuckClass === "in_progress" && claimer && !isLive(claimer.lastSeen, now)) {
        // A cancel is carried out by the agent: with the agent gone, only the wait ends it.
        const outcome = action.swapCommittedAt ? "is recorded completed (it rolls forward)" : "fails";
        hint =
          `The agent on host ${action.claimedBy} is silent: check that host's agent. If it does not come back, the action ${outcome} ` +
          `${orphanWait(orphanedAfterMs)} after its last report; a cancel would wait for the agent too.`;
      } else if (view!.stuckClass === "in_progress") {
        hint = `The agent on host ${action.claimedBy} has reported nothing for ${ago(last, now).replace(" ago", "")}: check its logs and heartbeat; cancel with POST /api/deployments/${action.id}/cancel.`;
      } else {
        hint = `It is running; follow it with GET /api/logs?action_id=${action.id}.`;
      }
      break;
    }
    default: {
      lines.push(`${name} is queued, created ${ago(action.createdAt, now)}${action.priority > 0 ? `, priority ${action.priority}` : ""}.`);
      if (FAST_RPC_TYPES.has(action.actionType)) {
        lines.push(`It is a fast request to any agent, outside the deploy lane: no agent claims it and no admission gate holds it. It ends when an agent answers; ${liveAgents.length} agent(s) live now.`);
        hint =
          liveAgents.length === 0
            ? "No live agent: start an agent; the request is asked again until one answers."
            : "An agent answers within a minute and a half (git's own time limits); if it stays queued longer, check the agents' logs.";
        break;
      }
      if (action.dispatchedTo) {
        lines.push(
          host && isLive(host.lastSeen, now)
            ? `It was dispatched to host ${action.dispatchedTo} (live, last heartbeat ${ago(host.lastSeen, now)}).`
            : `It was dispatched to host ${action.dispatchedTo}, which is not live${host ? ` (last heartbeat ${ago(host.lastSeen, now)})` : ""}; it moves to another host once that host has been silent for a minute.`,
        );
      } else {
        lines.push(`It was dispatched to any agent (work.any): no agent was live then. ${liveAgents.length} agent(s) live now.`);
      }
      if (action.admissionCheckReason) {
        lines.push(sentence(`The agent last refused to claim it ${ago(action.lastAdmissionCheckAt ?? action.updatedAt, now)}: ${action.admissionCheckReason}`));
      } else {
        lines.push("No agent has tried to claim it yet.");
      }
      if (admitForceAvailable(action, now)) {
        lines.push(`An admission override is valid until ${action.admitForceUntil!.toISOString()} (reason: ${action.admitForceReason}).`);
      } else if (action.admitForceUsed) {
        lines.push("Its admission override was used.");
      }
      const dryRun = checkAdmission(await admissionInput(em, action, action.dispatchedTo ?? "any", now));
      if (dryRun.verdict === "refuse" && dryRun.blockingActionId) {
        const found = await em.findOne(Action, { id: dryRun.blockingActionId });
        // Another group's action is never named to a tenant (not even that it exists): only that a slot is awaited.
        if (found && canSeeGroup(caller, found.groupSlug)) blocking = found;
      }
      if (dryRun.verdict === "refuse") {
        if (dependency && dryRun.blockingActionId === dependency.id) {
          const runner = dependency.status === "in_progress" && dependency.claimedBy ? await em.findOne(Agent, { hostId: dependency.claimedBy }) : null;
          hint =
            runner && !isLive(runner.lastSeen, now)
              ? `It starts when ${dependency.actionType} ${dependency.id} completes, but host ${runner.hostId}, which runs it, has been silent since ${ago(runner.lastSeen, now)}: ` +
                `check that host's agent; if it does not come back, the ${dependency.actionType} fails after ${orphanWait(orphanedAfterMs)} without progress, and this action with it.`
              : `It starts when ${dependency.actionType} ${dependency.id} completes; nothing to do.`;
        } else if (blocking && blocking.status === "in_progress") {
          hint = `It starts when ${blocking.actionType} ${blocking.id} finishes.`;
        } else {
          hint = `It waits for a free slot on host ${action.dispatchedTo ?? "any"}: prioritize it (POST /api/deployments/queue/prioritize) or, as an admin, admit it past the gate once (POST /api/deployments/queue/${action.id}/admit-force).`;
        }
      } else if (dryRun.verdict === "abandon") {
        hint = `${dryRun.reason} The next claim ends this action too.`;
      } else if (liveAgents.length === 0) {
        hint = "No live agent: start an agent (or check that it heartbeats on agent.hb.<host_id>) and the action is picked up.";
      } else if (action.dispatchedTo && !(host && isLive(host.lastSeen, now))) {
        hint = `Host ${action.dispatchedTo} is not live; the action is dispatched again to a live host within a minute.`;
      } else if (view!.stuckClass === "never_claimed") {
        hint = `The gates would admit it, yet no agent has claimed it: check the work consumer of host ${action.dispatchedTo ?? "any"} and its logs.`;
      } else {
        hint = "The gates would admit it: the agent claims it on its next poll.";
      }
    }
  }

  if (dependency) {
    lines.push(`It depends on ${dependency.actionType} ${dependency.id}, which is ${dependency.status}${dependency.claimedBy && dependency.status === "in_progress" ? ` on host ${dependency.claimedBy}` : ""}.`);
  } else if (action.dependsOn) {
    lines.push(`It depends on ${action.dependsOn}, which no longer exists.`);
  }
  if (blocking && blocking.id !== dependency?.id) {
    lines.push(`It is blocked by ${blocking.actionType} ${blocking.id} (${blocking.status}, created ${ago(blocking.createdAt, now)}).`);
  }
  return { view: view!, narrative: lines.join(" "), hint, blockingActionId: blocking?.id ?? null };
}
