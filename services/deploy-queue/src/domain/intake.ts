/**
 * Where actions come from: `events.apps_builds.build_requested` (POST /api/builds, spec doc 1
 * section 3.1) becomes a BUILD action whose id is the build id and, with auto_deploy, a DEPLOY
 * that depends on it. Both are dispatched in the same transaction; the DEPLOY's claim is refused
 * until its BUILD completes.
 */
import { subjects, type BuildRequested } from "@platform/bus";
import { outboxEvent, type EntityManager, type OutboxRow } from "@platform/db";
import { actionUpdated, type AnnouncedAction } from "./events.ts";
import { currentSlugs } from "./groups.ts";
import { agentLoads, placeAction, type Dispatched } from "./placement.ts";

/**
 * A queued action as intake writes it: a plain row, not an ORM entity, since intake is the
 * queue's hottest write (every POST /api/builds) and the unit of work cost more than the insert.
 */
export interface NewAction extends AnnouncedAction {
  dependsOn: string | null;
  autoDeploy: boolean;
  commitMessage: string | null;
  commitAuthor: string | null;
  createdBy: string;
  dispatchedTo: string | null;
  dispatchedAt: Date | null;
  retryCount: number;
  /** When the work was asked for: a build's actions are as old as the request, not the event. */
  createdAt: Date;
}

/**
 * Creates and dispatches the actions of a build request. Idempotent on the build id as well as
 * on the event id (the consumer's ledger): an existing BUILD action means nothing to do. Every
 * event enqueued (work messages, announcements) is added to `dispatched` (see publishDispatched).
 */
export async function acceptBuildRequest(em: EntityManager, req: BuildRequested, now: Date, dispatched?: Dispatched[]): Promise<NewAction[]> {
  return acceptBuildRequests(em, [req], now, dispatched);
}

/**
 * `acceptBuildRequest` for the requests of one batch of events: one read of the agents' loads and
 * one statement writing every action and outbox event of the batch, placement kept up to date as
 * each action is placed.
 */
export async function acceptBuildRequests(em: EntityManager, reqs: BuildRequested[], now: Date, dispatched?: Dispatched[]): Promise<NewAction[]> {
  if (reqs.length === 0) return [];
  const loads = await agentLoads(em, now);
  const renamed = await currentSlugs(em, reqs.map((r) => r.group_slug));
  const actions: NewAction[] = [];
  const events: QueuedEvent[] = [];
  const sent: Dispatched[] = [];
  /** An outbox event of `action`: written only with it, and sent at once after the commit. */
  const send = (action: NewAction, subject: string, message: Dispatched["message"]) => {
    const event = outboxEvent(subject, { ...message });
    events.push({ ...event, actionId: action.id });
    sent.push({ eventId: event.id, subject, message });
  };
  const seen = new Set<string>();
  for (const req of reqs) {
    if (seen.has(req.build_id)) continue;
    seen.add(req.build_id);
    const [build, ...dependents] = newBuildActions({ ...req, group_slug: renamed.get(req.group_slug) ?? req.group_slug }, now);
    const placed = placeAction(build, now, loads);
    send(build, placed.subject, placed.message);
    actions.push(build);
    for (const action of dependents) {
      const beside = placeAction(action, now, loads, placed.hostId);
      send(action, beside.subject, beside.message);
      // The BUILD is not announced: its queued state is what apps-builds wrote in the builds row
      // when it asked for it. The DEPLOY is news to the app's last_deploy_* fields.
      send(action, subjects.events.actionUpdated, actionUpdated(action, now));
      actions.push(action);
    }
  }
  const created = await insertActions(em, actions, events, now);
  dispatched?.push(...sent.filter((d) => created.has(d.message.action_id)));
  return actions.filter((a) => created.has(a.id));
}

/** An outbox event of an action: written only if its action is. */
interface QueuedEvent extends OutboxRow {
  actionId: string;
}

const ACTION_COLUMNS = `id, action_type, status, group_slug, app_name, branch, image_tag, commit_message, commit_author, depends_on, auto_deploy,
  deploy_warnings, payload, dispatched_to, dispatched_at, created_by, created_at, updated_at`;
const ACTION_VALUES = `i.id, i.action_type, 'queued', i.group_slug, i.app_name, i.branch, i.image_tag, i.commit_message, i.commit_author, i.depends_on,
  i.auto_deploy, '[]'::jsonb, i.payload, i.dispatched_to, i.now, i.created_by, i.created_at, i.now`;

/**
 * New actions in one statement: a BUILD that exists already (a request seen before under another
 * event) is skipped with its dependents, and an event is written only with its action. Rows go as
 * one JSON document each way (jsonb_to_recordset), a single parameter however many there are.
 */
const INSERT_ACTIONS = `with input as (
    select i.*, ?::timestamptz as now from jsonb_to_recordset(?::jsonb)
      as i(id uuid, action_type text, group_slug text, app_name text, branch text, image_tag text, commit_message text, commit_author text,
           depends_on uuid, auto_deploy boolean, payload jsonb, dispatched_to text, created_by text, created_at timestamptz)),
  roots as (
    insert into actions (${ACTION_COLUMNS}) select ${ACTION_VALUES} from input i where i.depends_on is null
    on conflict (id) do nothing returning id),
  dependents as (
    insert into actions (${ACTION_COLUMNS}) select ${ACTION_VALUES} from input i join roots r on r.id = i.depends_on
    on conflict (id) do nothing returning id),
  created as (select id from roots union all select id from dependents),
  events as (
    insert into outbox (id, subject, payload, headers)
    select e.id, e.subject, e.payload, e.headers
    from jsonb_to_recordset(?::jsonb) as e(id uuid, action_id uuid, subject text, payload jsonb, headers jsonb)
    join created c on c.id = e.action_id)
  select id from created`;

async function insertActions(em: EntityManager, actions: NewAction[], events: QueuedEvent[], now: Date): Promise<Set<string>> {
  const rows = actions.map((a) => ({
    id: a.id,
    action_type: a.actionType,
    group_slug: a.groupSlug,
    app_name: a.appName,
    branch: a.branch,
    image_tag: a.imageTag,
    commit_message: a.commitMessage,
    commit_author: a.commitAuthor,
    depends_on: a.dependsOn,
    auto_deploy: a.autoDeploy,
    payload: a.payload,
    dispatched_to: a.dispatchedTo,
    created_by: a.createdBy,
    created_at: a.createdAt.toISOString(),
  }));
  const outbox = events.map((e) => ({ id: e.id, action_id: e.actionId, subject: e.subject, payload: e.payload, headers: e.headers }));
  const created = await em
    .getConnection()
    .execute<{ id: string }[]>(INSERT_ACTIONS, [now, JSON.stringify(rows), JSON.stringify(outbox)], "all", em.getTransactionContext());
  return new Set(created.map((r) => r.id));
}

/** The BUILD action of a request and, with auto-deploy, the DEPLOY that waits for it. */
function newBuildActions(req: BuildRequested, now: Date): [NewAction, ...NewAction[]] {
  const requested = req.requested_at ? new Date(req.requested_at) : now;
  const common = {
    // Another host's clock a little ahead puts no action in the future.
    createdAt: requested < now ? requested : now,
    groupSlug: req.group_slug,
    appName: req.app_name,
    branch: req.branch,
    imageTag: req.tag,
    commitMessage: req.commit_message ?? null,
    commitAuthor: req.commit_author ?? null,
    autoDeploy: req.auto_deploy,
    status: "queued",
    phase: null,
    errorMessage: null,
    result: null,
    claimedAt: null,
    claimedBy: null,
    completedAt: null,
    swapCommittedAt: null,
    cancelRequested: false,
    admissionCheckReason: null,
    dispatchedTo: null,
    dispatchedAt: null,
    retryCount: 0,
    createdBy: req.created_by,
  };
  const build: NewAction = {
    ...common,
    id: req.build_id,
    actionType: "BUILD",
    dependsOn: null,
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
  };
  if (!req.auto_deploy || !req.deploy_action_id) return [build];
  const deploy: NewAction = {
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
      previous_tag: req.previous_tag ?? null,
    },
  };
  return [build, deploy];
}
