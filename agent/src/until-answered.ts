/**
 * The agent's calls to the services that are safe to make twice (a phase report, a completion,
 * reading a release), made again while the service is out of reach or answers 5xx: a service
 * that restarts for a second or two must not fail the build or deploy the agent is running. A
 * 4xx answer is the service's word and is final.
 */
import { platformErrorOf } from "@platform/rpc";

const FIRST_WAIT_MS = 250;
const MAX_WAIT_MS = 15_000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The HTTP status behind an RPC failure; a failure with none (the connection) counts as 503. */
export function failureStatus(err: unknown): number {
  return platformErrorOf(err)?.status ?? 503;
}

export interface UntilAnsweredOptions {
  /** How long to keep trying (unbounded when omitted). */
  forMs?: number;
  /** Stops trying (the agent is stopping). */
  stopping?: () => boolean;
  onRetry?: (err: unknown, attempt: number) => void;
}

export async function untilAnswered<T>(call: () => Promise<T>, opts: UntilAnsweredOptions = {}): Promise<T> {
  const deadline = opts.forMs === undefined ? Number.POSITIVE_INFINITY : Date.now() + opts.forMs;
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      const wait = Math.min(MAX_WAIT_MS, FIRST_WAIT_MS * 2 ** (attempt - 1));
      if (failureStatus(err) < 500 || opts.stopping?.() || Date.now() + wait > deadline) throw err;
      opts.onRetry?.(err, attempt);
      await sleep(wait);
    }
  }
}
