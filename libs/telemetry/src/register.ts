/**
 * Preloaded with `node --import @platform/telemetry/register` so the OpenTelemetry SDK starts,
 * and the ESM loader hook is in place, before any application module is imported.
 */
import { register } from "node:module";
import { isMainThread } from "node:worker_threads";
import { createAddHookMessageChannel } from "import-in-the-middle";
import { startTelemetry } from "./sdk.ts";

if (isMainThread) {
  const { registerOptions, waitForAllMessagesAcknowledged } = createAddHookMessageChannel();
  register("import-in-the-middle/hook.mjs", import.meta.url, registerOptions);
  startTelemetry();
  await waitForAllMessagesAcknowledged();
}
