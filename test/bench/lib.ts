/**
 * Shared parts of the benchmarks: load generation with autocannon against loopback, and the
 * report line each benchmark prints (its figure against a baseline measured in the same run).
 */
import autocannon from "autocannon";
import type { TestFleet } from "@platform/testing";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface LoadResult {
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  non2xx: number;
}

export async function load(url: string, opts: { headers?: Record<string, string>; seconds?: number; connections?: number } = {}): Promise<LoadResult> {
  const result = await autocannon({
    url,
    headers: opts.headers,
    duration: opts.seconds ?? Number(process.env.BENCH_SECONDS ?? 8),
    connections: opts.connections ?? 32,
    pipelining: 1,
  });
  return {
    requestsPerSecond: result.requests.average,
    p50Ms: result.latency.p50,
    p99Ms: result.latency.p99,
    errors: result.errors + result.timeouts,
    non2xx: result.non2xx,
  };
}

/** Warms a route so JIT and caches settle before it is measured. */
export async function warm(url: string, headers?: Record<string, string>): Promise<void> {
  await load(url, { headers, seconds: 2, connections: 8 });
}

export interface Verdict {
  name: string;
  ok: boolean;
}

export function report(name: string, subject: LoadResult, baseline: LoadResult, target: number): Verdict {
  const ratio = subject.requestsPerSecond / baseline.requestsPerSecond;
  const ok = ratio >= target && subject.errors === 0 && subject.non2xx === 0;
  console.log(
    `${name}: ${subject.requestsPerSecond.toFixed(0)} req/s (p99 ${subject.p99Ms} ms) vs baseline ${baseline.requestsPerSecond.toFixed(0)} req/s ` +
      `(p99 ${baseline.p99Ms} ms) = ${(ratio * 100).toFixed(1)}% of baseline; target >= ${(target * 100).toFixed(0)}% ${ok ? "PASS" : "FAIL"}` +
      (subject.errors || subject.non2xx ? ` [errors ${subject.errors}, non-2xx ${subject.non2xx}]` : ""),
  );
  return { name, ok };
}

/** One API call with an API key; the body parsed as JSON when it is JSON. */
export async function call<T = any>(fleet: TestFleet, key: string, method: string, urlPath: string, body?: unknown): Promise<{ status: number; body: T }> {
  const res = await fetch(`${fleet.api}${urlPath}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined ? { "content-type": "application/json" } : {}) },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : text;
  } catch {
    // Not JSON: keep the text.
  }
  return { status: res.status, body: parsed as T };
}

/** Reads until `done` holds, every 250 ms; past the timeout it throws with the last value read. */
export async function waitFor<T>(read: () => Promise<T>, done: (v: T) => boolean, timeoutMs = 120_000, what = "a condition"): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (done(v)) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}; last value ${JSON.stringify(v)}`);
    await sleep(250);
  }
}
