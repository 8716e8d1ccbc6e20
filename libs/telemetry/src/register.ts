/**
 * Preloaded with `node --import @platform/telemetry/register` so the OpenTelemetry SDK starts,
 * and the ESM loader hook is in place, before any application module is imported.
 *
 * The hook runs in-thread (`module.registerHooks`) and wraps only the modules the SDK patches.
 * The off-thread loader (`module.register`) used before paid a round trip to its thread for
 * every module a process loads: about five seconds of CPU per process start, the better part of
 * the fleet's start-up.
 */
import { isMainThread } from "node:worker_threads";
import { register } from "import-in-the-middle/register-hooks.mjs";
import { INSTRUMENTED_MODULES, startTelemetry } from "./sdk.ts";

if (isMainThread) {
  register({ include: INSTRUMENTED_MODULES });
  startTelemetry();
}
