/**
 * `npm run bench`: every benchmark under test/bench (files named *.bench.ts exporting `run`),
 * each printing its figures as a ratio against a baseline measured in the same run. Exits
 * non-zero when a target is missed. Pass names to run some: `npm run bench -- gateway`.
 */
import { readdirSync } from "node:fs";
import { ensureInfrastructure, DEFAULT_DATA_DIR, DEFAULT_DATABASE_URL, DEFAULT_NATS_URL } from "@platform/fleet";

const dir = new URL("../test/bench/", import.meta.url);
const wanted = process.argv.slice(2);
const files = readdirSync(dir)
  .filter((f) => f.endsWith(".bench.ts"))
  .filter((f) => wanted.length === 0 || wanted.some((w) => f.includes(w)))
  .sort();

await ensureInfrastructure({
  databaseUrl: process.env.DATABASE_URL || DEFAULT_DATABASE_URL,
  natsUrl: process.env.NATS_URL || DEFAULT_NATS_URL,
  dataDir: DEFAULT_DATA_DIR,
});

let failed = 0;
for (const file of files) {
  console.log(`\n== ${file}`);
  const mod = (await import(new URL(file, dir).href)) as { run: () => Promise<Array<{ name: string; ok: boolean }>> };
  for (const verdict of await mod.run()) if (!verdict.ok) failed++;
}
console.log(failed === 0 ? "\nall benchmark targets met" : `\n${failed} benchmark target(s) missed`);
process.exit(failed === 0 ? 0 : 1);
