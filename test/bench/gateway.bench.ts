/**
 * Gateway throughput (issue: foundation, item 10): GET /api/health and an authenticated
 * GET /api/auth/me against a bare Fastify route measured in the same run.
 * Targets: health >= 70% of bare Fastify's requests per second; auth/me >= 40%.
 */
import { fork } from "node:child_process";
import { fileURLToPath } from "node:url";
import { freePort, startTestFleet } from "@platform/testing";
import { load, report, warm, type LoadResult, type Verdict } from "./lib.ts";

const ROUNDS = 3;

export async function run(): Promise<Verdict[]> {
  const fleet = await startTestFleet({ agent: false, env: { LOG_LEVEL: "warn" } });
  const port = await freePort();
  const bare = fork(fileURLToPath(new URL("./bare-fastify.ts", import.meta.url)), [], { env: { ...process.env, PORT: String(port) }, stdio: "inherit" });
  await new Promise<void>((resolve, reject) => {
    bare.once("message", () => resolve());
    bare.once("exit", (code) => reject(new Error(`bare Fastify exited with ${code}`)));
  });
  try {
    const created = await fetch(`${fleet.api}/keys`, {
      method: "POST",
      headers: { authorization: `Bearer ${fleet.rootKey}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "bench", scope: "read", platform: true }),
    });
    const { key } = (await created.json()) as { key: string };
    const auth = { authorization: `Bearer ${key}` };
    const bareUrl = `http://127.0.0.1:${port}/bare`;
    const healthUrl = `${fleet.api}/health`;
    const meUrl = `${fleet.api}/auth/me`;

    await warm(bareUrl);
    await warm(healthUrl);
    await warm(meUrl, auth);
    // This machine is shared and noisy (runs of one side differ by a fifth): the three routes are
    // measured in interleaved rounds, so each round shares the machine's state, and every side
    // keeps its best round. The same treatment for the baseline and the gateway.
    const best = (a: LoadResult | undefined, b: LoadResult) => (a && a.requestsPerSecond >= b.requestsPerSecond ? a : b);
    let baseline: LoadResult | undefined;
    let health: LoadResult | undefined;
    let me: LoadResult | undefined;
    for (let round = 0; round < ROUNDS; round++) {
      baseline = best(baseline, await load(bareUrl));
      health = best(health, await load(healthUrl));
      me = best(me, await load(meUrl, { headers: auth }));
    }
    return [report("gateway GET /api/health", health!, baseline!, 0.7), report("gateway GET /api/auth/me (authenticated)", me!, baseline!, 0.4)];
  } finally {
    bare.kill("SIGTERM");
    await fleet.stop();
  }
}
