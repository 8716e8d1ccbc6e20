/**
 * Where actions come from: `events.apps_builds.build_requested` (POST /api/builds, spec doc 1
 * section 3.1) becomes a BUILD action whose id is the build id and, with auto_deploy, a DEPLOY
 * that depends on it. Both are dispatched in the same transaction; the DEPLOY's claim is refused
 * until its BUILD completes.
 */
import type { EntityManager } from "@platform/db";
import { Action } from "../entities/index.ts";
import { announce } from "./events.ts";
import { agentLoads, dispatch, type Dispatched } from "./placement.ts";

/** The event's data, as apps-builds enqueues it. */
export interface BuildRequested {
  build_id: string;
  deploy_action_id: string | null;
  app_name: string;
  branch: string;
  group_slug: string;
  tag: string;
  repository: string;
  config_path: string;
  auto_deploy: boolean;
  created_by: string;
  commit_message?: string | null;
  commit_author?: string | null;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function isUuid(id: unknown): id is string {
  return typeof id === "string" && UUID.test(id);
}

function requireText(data: Record<string, unknown>, key: string): string {
  const v = data[key];
  if (typeof v !== "string" || v === "") throw new Error(`build_requested event without ${key}`);
  return v;
}

/** Checks the shape of the event; a malformed event is a bug upstream and fails loudly. */
export function parseBuildRequested(data: Record<string, unknown>): BuildRequested {
  if (!isUuid(data.build_id)) throw new Error("build_requested event without a uuid build_id");
  const deployId = data.deploy_action_id ?? null;
  if (deployId !== null && !isUuid(deployId)) throw new Error("build_requested event with a malformed deploy_action_id");
  const optional = (k: string) => (typeof data[k] === "string" && data[k] !== "" ? (data[k] as string) : null);
  return {
    build_id: data.build_id,
    deploy_action_id: deployId,
    app_name: requireText(data, "app_name"),
    branch: requireText(data, "branch"),
    group_slug: requireText(data, "group_slug"),
    tag: requireText(data, "tag"),
    repository: requireText(data, "repository"),
    config_path: typeof data.config_path === "string" && data.config_path ? data.config_path : "platform.yaml",
    auto_deploy: data.auto_deploy === true,
    created_by: typeof data.created_by === "string" ? data.created_by : "system",
    commit_message: optional("commit_message"),
    commit_author: optional("commit_author"),
  };
}

/**
 * Creates and dispatches the actions of a build request. Idempotent on the build id as well as
 * on the event id (the consumer's ledger): an existing BUILD action means nothing to do. The work
 * messages enqueued are added to `dispatched` (see publishDispatched).
 */
export async function acceptBuildRequest(em: EntityManager, req: BuildRequested, now: Date, dispatched?: Dispatched[]): Promise<Action[]> {
  return acceptBuildRequests(em, [req], now, dispatched);
}

/**
 * `acceptBuildRequest` for the requests of one batch of events: one read of what exists and of
 * the agents' loads for all of them, placement kept up to date as each is dispatched.
 */
export async function acceptBuildRequests(em: EntityManager, reqs: BuildRequested[], now: Date, dispatched?: Dispatched[]): Promise<Action[]> {
  if (reqs.length === 0) return [];
  const existing = await em.find(Action, { id: { $in: reqs.map((r) => r.build_id) } }, { fields: ["id"] });
  const seen = new Set(existing.map((a) => a.id));
  const loads = await agentLoads(em, now);
  const created: Action[] = [];
  for (const req of reqs) {
    if (seen.has(req.build_id)) continue;
    seen.add(req.build_id);
    const actions = newBuildActions(em, req, now);
    const buildHost = await dispatch(em, actions[0]!, now, { loads, dispatched });
    for (const action of actions.slice(1)) await dispatch(em, action, now, { loads, preferHost: buildHost, dispatched });
    // The BUILD is not announced: its queued state is what apps-builds wrote in the builds row
    // when it asked for it. The DEPLOY is news to the app's last_deploy_* fields.
    for (const action of actions.slice(1)) announce(em, action, now);
    created.push(...actions);
  }
  return created;
}

/** The BUILD action of a request and, with auto-deploy, the DEPLOY that waits for it. */
function newBuildActions(em: EntityManager, req: BuildRequested, now: Date): Action[] {
  const common = {
    groupSlug: req.group_slug,
    appName: req.app_name,
    branch: req.branch,
    imageTag: req.tag,
    commitMessage: req.commit_message ?? null,
    commitAuthor: req.commit_author ?? null,
    autoDeploy: req.auto_deploy,
    deployWarnings: [],
    status: "queued",
    createdBy: req.created_by,
    createdAt: now,
    updatedAt: now,
  };
  const build = em.create(Action, {
    ...common,
    id: req.build_id,
    actionType: "BUILD",
    payload: {
      build_id: req.build_id,
      repository: req.repository,
      branch: req.branch,
      config_path: req.config_path,
      tag: req.tag,
      app_name: req.app_name,
      group_slug: req.group_slug,
      auto_deploy: req.auto_deploy,
    },
  });
  if (!req.auto_deploy || !req.deploy_action_id) return [build];
  const deploy = em.create(Action, {
    ...common,
    id: req.deploy_action_id,
    actionType: "DEPLOY",
    dependsOn: build.id,
    payload: {
      deployment_id: req.deploy_action_id,
      build_id: req.build_id,
      app_name: req.app_name,
      branch: req.branch,
      group_slug: req.group_slug,
      image_tag: req.tag,
      config_path: req.config_path,
    },
  });
  return [build, deploy];
}
