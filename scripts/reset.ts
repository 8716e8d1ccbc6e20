/**
 * `npm run reset`: forgets everything `npm start` made, so the next start begins from nothing:
 * the deployed apps' replicas still running, the database (`DATABASE_URL`), the platform's NATS
 * streams and object store (under `BUS_PREFIX`), and `.data/` (the Postgres, NATS and Caddy data
 * `npm start` kept there, the root key, the agent's images and releases). The platform must be
 * stopped first: a running one would write it all again.
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import pg from "pg";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { GATEWAY_PORT } from "@platform/config";
import { subjects } from "@platform/bus";
import { DEFAULT_DATA_DIR, DEFAULT_DATABASE_URL, DEFAULT_NATS_URL, isPortFree, probeNats, probePostgres, redactUrl, stopReplicas } from "@platform/fleet";

const say = (line: string) => process.stdout.write(`${line}\n`);
const databaseUrl = process.env.DATABASE_URL || DEFAULT_DATABASE_URL;
const natsUrl = process.env.NATS_URL || DEFAULT_NATS_URL;
const prefix = process.env.BUS_PREFIX ?? "";
const port = Number(process.env.PORT || GATEWAY_PORT);

if (!(await isPortFree(port))) {
  process.stderr.write(`npm run reset: something listens on port ${port}: stop the platform (Ctrl-C in npm start) first.\n`);
  process.exit(1);
}

const runDir = path.resolve(process.env.AGENT_RUN_DIR || path.join(DEFAULT_DATA_DIR, "agent", "run"));
const replicas = await stopReplicas(runDir);
if (replicas > 0) say(`stopped ${replicas} replica(s) of deployed apps`);

if ((await probePostgres(databaseUrl)).ok) {
  const name = new URL(databaseUrl).pathname.slice(1);
  const admin = new URL(databaseUrl);
  admin.pathname = "/postgres";
  const client = new pg.Client({ connectionString: admin.toString() });
  await client.connect();
  try {
    await client.query(`drop database if exists ${pg.escapeIdentifier(name)} with (force)`);
    say(`dropped database ${name} (${redactUrl(databaseUrl)})`);
  } finally {
    await client.end();
  }
} else {
  say(`Postgres at ${redactUrl(databaseUrl)} does not answer: its data, if npm start kept it under .data/, goes with .data/`);
}

if ((await probeNats(natsUrl)).ok) {
  const nc = await connect({ servers: natsUrl, name: "platform-reset" });
  try {
    const jsm = await jetstreamManager(nc);
    const names = [...Object.values(subjects.streams(prefix)).map((s) => s.name), ...Object.values(subjects.buckets(prefix)).map((b) => `OBJ_${b}`)];
    for (const name of names) {
      const deleted = await jsm.streams.delete(name).catch(() => false);
      if (deleted) say(`deleted stream ${name}`);
    }
  } finally {
    await nc.close();
  }
} else {
  say(`NATS at ${natsUrl} does not answer: its data, if npm start kept it under .data/, goes with .data/`);
}

await rm(DEFAULT_DATA_DIR, { recursive: true, force: true });
say(`removed ${DEFAULT_DATA_DIR}`);
say("The next npm start begins from nothing (a new root key included).");
