/**
 * Placement and dispatch (ARCHITECTURE section 4, the deploy lane). The action row is the truth;
 * dispatch adds, in the same transaction, an outbox event on `work.host.<host_id>` (placement
 * chose the host) or `work.any` (no agent is live: whichever agent comes first takes it). The
 * event's data is `{action_id, action_type}`; the agent then claims the action (admission).
 *
 * Placement picks a live, schedulable agent with the fewest in-flight (claimed) actions, then the
 * fewest queued actions already dispatched to it, then by host_id. A dependent action goes to the
 * host of its dependency when that host is live (the image is already there); a deploy an
 * operator gave a placement plan goes to the plan's host when that host is live.
 */
import { enqueueEvent, type EntityManager } from "@platform/db";
import { subjects } from "@platform/bus";
import type { Caller } from "@platform/caller";
import { PlatformError } from "@platform/errors";
import { Action } from "../entities/index.ts";
import { LIVE_WINDOW_MS, isLive } from "./agents.ts";
import type { ActionUpdated } from "./events.ts";

export interface AgentLoad {
  hostId: string;
  lastSeen: Date;
  schedulable: boolean;
  /** Actions in progress claimed by this host. */
  inFlight: number;
  /** Queued actions dispatched to this host, not claimed yet. */
  assigned: number;
}

/** An operator's `placement_plan` of POST /api/deployments: the agent host to deploy on. */
export interface PlacementPlan {
  host: string;
}

/**
 * A placement plan is for platform operators (403 for anyone else): the platform places a
 * tenant's deploys. Its one key is `host`, an agent's host id (400 otherwise: POST /api/deployments
 * answers every validation failure 400).
 */
export function checkPlacementPlan(caller: Caller, raw: unknown): PlacementPlan | null {
  if (raw === null || raw === undefined) return null;
  if (!caller.platformOperator) throw PlatformError.forbidden("placement_plan is for platform operators: the platform places a tenant's deploys.");
  if (typeof raw !== "object" || Array.isArray(raw)) throw PlatformError.badRequest('placement_plan must be an object such as {"host": "<agent host id>"}.');
  const unknown = Object.keys(raw).filter((k) => k !== "host");
  if (unknown.length > 0) throw PlatformError.badRequest(`placement_plan takes only host; it has ${unknown.map((k) => `'${k}'`).join(", ")}.`);
  const host = "host" in raw && typeof raw.host === "string" ? raw.host.trim() : "";
  if (!host) throw PlatformError.badRequest("placement_plan.host must be the host id of an agent.");
  return { host };
}

/** The host to dispatch to, or null for `work.any`. Pure: the caller supplies the loads. */
export function choosePlacement(agents: AgentLoad[], now: Date, preferHost?: string | null): string | null {
  const live = agents.filter((a) => a.schedulable && isLive(a.lastSeen, now));
  if (preferHost && live.some((a) => a.hostId === preferHost)) return preferHost;
  live.sort((a, b) => a.inFlight - b.inFlight || a.assigned - b.assigned || (a.hostId < b.hostId ? -1 : a.hostId > b.hostId ? 1 : 0));
  return live[0]?.hostId ?? null;
}

export async function agentLoads(em: EntityManager, now: Date): Promise<AgentLoad[]> {
  const rows = await em.getConnection().execute<{ host_id: string; last_seen: Date | string; schedulable: boolean; in_flight: number; assigned: number }[]>(
    `select g.host_id, g.last_seen, g.schedulable,
       (select count(*)::int from actions x where x.status = 'in_progress' and x.claimed_by = g.host_id) as in_flight,
       (select count(*)::int from actions x where x.status = 'queued' and x.dispatched_to = g.host_id) as assigned
     from agents g where g.last_seen > ?`,
    [new Date(now.getTime() - LIVE_WINDOW_MS)],
    "all",
    em.getTransactionContext(),
  );
  return rows.map((r) => ({
    hostId: r.host_id,
    lastSeen: new Date(r.last_seen),
    schedulable: r.schedulable,
    inFlight: Number(r.in_flight),
    assigned: Number(r.assigned),
  }));
}

/** The work message of an action: what the agent's lane reads from `data`. */
export interface WorkMessage {
  action_id: string;
  action_type: string;
}

export function workSubject(hostId: string | null): string {
  return hostId ? subjects.work.host(hostId) : subjects.work.any;
}

/**
 * An outbox event of a transaction to be sent at once: a work message (or, from intake, the
 * announcement of a new action). Once that transaction has committed, `publishDispatched` sends
 * it instead of leaving it to the relay's next batch; the relay still publishes the row (the
 * guarantee), with the same `Nats-Msg-Id`, and JetStream drops that copy as a duplicate.
 */
export interface Dispatched {
  eventId: string;
  subject: string;
  message: WorkMessage | ActionUpdated;
}

/** What placement decided for an action: the host (null: `work.any`) and its work message. */
export interface Placed {
  hostId: string | null;
  subject: string;
  message: WorkMessage;
}

/**
 * Places `action` on a host and sets its dispatch fields; `loads` is updated as the action is
 * assigned, so several actions placed in one transaction spread as they should.
 */
export function placeAction(
  action: Pick<Action, "id" | "actionType" | "dispatchedAt" | "dispatchedTo" | "retryCount">,
  now: Date,
  loads: AgentLoad[],
  preferHost?: string | null,
): Placed {
  const hostId = choosePlacement(loads, now, preferHost);
  const load = loads.find((l) => l.hostId === hostId);
  if (load) load.assigned += 1;
  if (action.dispatchedAt) action.retryCount += 1;
  action.dispatchedTo = hostId;
  action.dispatchedAt = now;
  return { hostId, subject: workSubject(hostId), message: { action_id: action.id, action_type: action.actionType } };
}

/**
 * Places `action` and enqueues its work message. `loads` may be passed when several actions are
 * dispatched in one transaction; they are updated as actions are assigned.
 */
export async function dispatch(
  em: EntityManager,
  action: Action,
  now: Date,
  opts: { loads?: AgentLoad[]; preferHost?: string | null; dispatched?: Dispatched[] } = {},
): Promise<string | null> {
  const placed = placeAction(action, now, opts.loads ?? (await agentLoads(em, now)), opts.preferHost);
  const eventId = enqueueEvent(em, placed.subject, { ...placed.message });
  opts.dispatched?.push({ eventId, subject: placed.subject, message: placed.message });
  return placed.hostId;
}

/** A host that has been silent this long no longer keeps the queued work dispatched to it. */
export const REDISPATCH_AFTER_MS = LIVE_WINDOW_MS;

/**
 * Moves queued actions away from hosts that went silent (or stopped taking work): each is placed
 * again and a new work message sent. The old message, if its host ever returns, meets a claim
 * that is already taken or an action that is still queued; either way it runs once.
 */
export async function redispatchFromSilentHosts(em: EntityManager, now: Date): Promise<Action[]> {
  const cutoff = new Date(now.getTime() - REDISPATCH_AFTER_MS);
  const ids = await em.getConnection().execute<{ id: string }[]>(
    `select x.id from actions x
       left join agents g on g.host_id = x.dispatched_to
     where x.status = 'queued' and x.dispatched_to is not null and x.dispatched_at < ?
       and (g.host_id is null or g.last_seen < ? or not g.schedulable)
     order by x.priority desc, x.created_at
     limit 200
     for update of x skip locked`,
    [cutoff, cutoff],
    "all",
    em.getTransactionContext(),
  );
  if (ids.length === 0) return [];
  const actions = await em.find(Action, { id: { $in: ids.map((r) => r.id) } });
  const loads = await agentLoads(em, now);
  for (const action of actions) await dispatch(em, action, now, { loads });
  return actions;
}

