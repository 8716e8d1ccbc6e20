/**
 * POST /api/builds throughput (issue: apps and builds, item 9a) against a baseline script doing
 * the same Postgres insert plus JetStream publish in the same run. Target: at least 40% of the
 * baseline's requests per second. Each side runs WARM_SECONDS uncounted first.
 *
 * What is measured is the API taking builds: the gateway, apps-builds writing the builds row and
 * its event, and deploy-queue turning the events into queued actions, all running. No agent runs:
 * one would spend the run cloning (and failing to clone) the bench's repository, a cost of the
 * builds' execution, not of accepting them (the claim benchmark measures agents taking work).
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import autocannon from "autocannon";
import { startTestFleet, uniquePrefix } from "@platform/testing";
import type { Verdict } from "./lib.ts";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 8);
const CONNECTIONS = 16;
const WARM_SECONDS = 2;

interface Rate {
  perSecond: number;
  p99Ms: number;
  errors: number;
}

/** The same work without the platform: one insert and one JetStream publish per request. */
async function baseline(databaseUrl: string, natsUrl: string, seconds = SECONDS): Promise<Rate> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: CONNECTIONS });
  await pool.query("create table if not exists bench_builds (id uuid primary key, app_name text, tag text, payload jsonb, created_at timestamptz default now())");
  const nc = await connect({ servers: natsUrl });
  const prefix = uniquePrefix("bb");
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: `${prefix}_BENCH`, subjects: [`${prefix}.>`] });
  const js = jetstream(nc);
  const latencies: number[] = [];
  let done = 0;
  const end = Date.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (Date.now() < end) {
        const t = performance.now();
        const id = randomUUID();
        const payload = { build_id: id, app_name: "bench", tag: `main-${id.slice(0, 8)}` };
        await pool.query("insert into bench_builds (id, app_name, tag, payload) values ($1, $2, $3, $4)", [id, "bench", payload.tag, payload]);
        await js.publish(`${prefix}.build_requested`, JSON.stringify(payload), { msgID: id });
        latencies.push(performance.now() - t);
        done++;
      }
    }),
  );
  await jsm.streams.delete(`${prefix}_BENCH`);
  await nc.close();
  await pool.end();
  latencies.sort((a, b) => a - b);
  return { perSecond: done / seconds, p99Ms: latencies[Math.floor(latencies.length * 0.99)] ?? 0, errors: 0 };
}

export async function run(): Promise<Verdict[]> {
  const fleet = await startTestFleet({ agent: false, env: { LOG_LEVEL: "warn" } });
  try {
    const created = await fetch(`${fleet.api}/groups`, {
      method: "POST",
      headers: { authorization: `Bearer ${fleet.rootKey}`, "content-type": "application/json" },
      body: JSON.stringify({ slug: "bench" }),
    });
    if (created.status !== 201) throw new Error(`group: ${created.status}`);
    const keyRes = await fetch(`${fleet.api}/keys`, {
      method: "POST",
      headers: { authorization: `Bearer ${fleet.rootKey}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "bench", scope: "deploy", group: "bench" }),
    });
    const { key } = (await keyRes.json()) as { key: string };
    const body = JSON.stringify({ app_name: "bench", repository: "https://example.com/bench/app.git", auto_deploy: false });
    const headers = { authorization: `Bearer ${key}`, "content-type": "application/json" };
    // The first build registers the app; preflight is skipped since nothing here is cloned.
    const first = await fetch(`${fleet.api}/builds?skip_preflight=true`, { method: "POST", headers, body });
    if (first.status !== 202) throw new Error(`first build: ${first.status} ${await first.text()}`);

    // Both sides are warmed first, not counted: a platform that has been up a while has long
    // compiled its hot paths, and the first seconds of a fresh fleet measure the JIT instead.
    const target = { url: `${fleet.api}/builds?skip_preflight=true`, method: "POST" as const, headers, body, connections: CONNECTIONS };
    await autocannon({ ...target, duration: WARM_SECONDS });
    await baseline(fleet.databaseUrl, fleet.natsUrl, WARM_SECONDS);
    const base = await baseline(fleet.databaseUrl, fleet.natsUrl);
    const result = await autocannon({ ...target, duration: SECONDS });
    const rps = result.requests.average;
    const ratio = rps / base.perSecond;
    const ok = ratio >= 0.4 && result.non2xx === 0 && result.errors === 0;
    console.log(
      `POST /api/builds: ${rps.toFixed(0)} req/s (p99 ${result.latency.p99} ms) vs baseline insert+publish ${base.perSecond.toFixed(0)} ops/s ` +
        `(p99 ${base.p99Ms.toFixed(1)} ms) = ${(ratio * 100).toFixed(1)}% of baseline; target >= 40% ${ok ? "PASS" : "FAIL"}` +
        (result.non2xx || result.errors ? ` [non-2xx ${result.non2xx}, errors ${result.errors}]` : ""),
    );
    return [{ name: "POST /api/builds", ok }];
  } finally {
    await fleet.stop();
  }
}
