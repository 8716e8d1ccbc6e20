/**
 * Every NATS subject and stream of the platform, defined once. Fixed tokens first, variable
 * tokens last; callers build names with these functions, never with string literals.
 */

/** Domain events a service announces through its outbox: `events.<service>.<event>`. */
export const events = {
  all: "events.>",
  /** A key or session stopped being valid; gateways drop it from their credential caches. */
  credentialRevoked: "events.identity.credential_revoked",
  groupCreated: "events.identity.group_created",
  /** A group's display name changed (its slug did not). */
  groupUpdated: "events.identity.group_updated",
  /**
   * A group got a new slug (its id stays): every service keeping rows under the old slug re-keys
   * them, gateways drop cached credentials naming it, agents relabel what they run.
   */
  groupRenamed: "events.identity.group_renamed",
  /** A group (owning no apps) was deleted: services drop what they still keep under its slugs. */
  groupDeleted: "events.identity.group_deleted",
  /** An app's repository check is (re)queued; apps-builds asks an agent and records the answer. */
  preflightRequested: "events.apps_builds.preflight_requested",
  preflightChecked: "events.apps_builds.preflight_checked",
  /**
   * A build was accepted (POST /api/builds): deploy-queue creates the BUILD action (its id is the
   * build id) and, with auto_deploy, the dependent DEPLOY.
   */
  buildRequested: "events.apps_builds.build_requested",
  /**
   * An app's branch was deleted, or its builds purged by an undeploy: services drop what they
   * still keep of them (health-aggregator: the builds' log lines, and every line of a deleted branch;
   * deploy-queue: a deleted branch's actions and history).
   */
  buildsDeleted: "events.apps_builds.builds_deleted",
  /** An app's live route must follow its visibility: deploy-queue queues a RECONCILE_ROUTING. */
  reconcileRequested: "events.apps_builds.reconcile_requested",
  /** A queue action changed state (claimed, phase, finished); apps-builds keeps builds rows in step. */
  actionUpdated: "events.deploy_queue.action_updated",
  /**
   * An agent's replica began crash-looping, or stopped (it ran a minute, or was released):
   * apps-builds shows it among the app's warnings while its release serves. Published by the
   * agent itself, which has no outbox.
   */
  serviceCrashLoop: "events.agent.service_crash_loop",
} as const;

export const work = {
  all: "work.>",
  host: (hostId: string) => `work.host.${hostId}`,
  any: "work.any",
} as const;

export const agentRpc = (hostId: string, op: string) => `agent.rpc.${hostId}.${op}`;
/** A fast RPC any agent may answer (agents subscribe with one queue group). */
export const agentRpcAny = (op: string) => `agent.rpc.any.${op}`;
export const heartbeat = (hostId: string) => `agent.hb.${hostId}`;
export const heartbeats = "agent.hb.*";
/** Log lines agents ship: `logs.<app>.<source>` (`_platform` for lines of no app). */
export const logs = (app: string, source: string) => `logs.${app || "_platform"}.${source}`;
export const allLogs = "logs.>";

export interface StreamDeclaration {
  name: string;
  subjects: string[];
  /** Seconds a message is kept. */
  maxAgeSeconds: number;
}

/** Streams the platform declares; `prefix` isolates test runs that share one NATS server. */
export function streams(prefix = ""): Record<"events" | "work" | "logs", StreamDeclaration> {
  const p = prefix ? `${prefix}_` : "";
  const sp = prefix ? `${prefix}.` : "";
  return {
    events: { name: `${p}EVENTS`, subjects: [`${sp}${events.all}`], maxAgeSeconds: 7 * 24 * 3600 },
    work: { name: `${p}WORK`, subjects: [`${sp}${work.all}`], maxAgeSeconds: 30 * 24 * 3600 },
    // Log lines wait here until health-aggregator has stored them; Postgres keeps them after.
    logs: { name: `${p}LOGS`, subjects: [`${sp}${allLogs}`], maxAgeSeconds: 24 * 3600 },
  };
}

/**
 * JetStream object-store buckets, kept apart from `streams()` because their owners create them
 * (the backing stream is `OBJ_<bucket>`, configured by the object-store client), not `declareStreams`.
 */
export function buckets(prefix = ""): Record<"images", string> {
  const p = prefix ? `${prefix}_` : "";
  return {
    // Build archives, so that any host can deploy any build (agent/src/image-store.ts).
    images: `${p}IMAGES`,
  };
}
