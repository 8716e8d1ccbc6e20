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
} as const;

export const work = {
  all: "work.>",
  host: (hostId: string) => `work.host.${hostId}`,
  any: "work.any",
} as const;

export const agentRpc = (hostId: string, op: string) => `agent.rpc.${hostId}.${op}`;
export const heartbeat = (hostId: string) => `agent.hb.${hostId}`;
export const heartbeats = "agent.hb.*";
export const logs = (app: string, source: string) => `logs.${app}.${source}`;

export interface StreamDeclaration {
  name: string;
  subjects: string[];
  /** Seconds a message is kept. */
  maxAgeSeconds: number;
}

/** Streams the platform declares; `prefix` isolates test runs that share one NATS server. */
export function streams(prefix = ""): Record<"events" | "work", StreamDeclaration> {
  const p = prefix ? `${prefix}_` : "";
  const sp = prefix ? `${prefix}.` : "";
  return {
    events: { name: `${p}EVENTS`, subjects: [`${sp}${events.all}`], maxAgeSeconds: 7 * 24 * 3600 },
    work: { name: `${p}WORK`, subjects: [`${sp}${work.all}`], maxAgeSeconds: 30 * 24 * 3600 },
  };
}
