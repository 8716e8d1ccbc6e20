/**
 * The Caddy router driver against a real Caddy (started on free ports, as a test fleet does) and
 * tiny upstream servers that answer with their own name.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { caddyAdmin } from "@platform/fleet";
import { freePorts, startCaddy, type StartedCaddy } from "@platform/testing";
import { CaddyRouter, NOT_FOUND_BODY, NO_MOUNT_BODY, NO_REPLICA_BODY, frontDoorRoute, keyOfRouteId, routeId } from "../src/router.ts";
import type { RouteSpec } from "../src/router-types.ts";

const HOST = "app.t.localhost";
const SLOW_MS = 600;

let dataDir: string;
let httpPort: number;
let caddy: StartedCaddy;
let router: CaddyRouter;
const upstreams: Record<"blue" | "green" | "api", { server: http.Server; dial: string }> = {} as never;

/** Answers its name; `/slow` answers it after SLOW_MS. */
async function upstream(name: string): Promise<{ server: http.Server; dial: string }> {
  const server = http.createServer((req, res) => {
    const answer = () => res.writeHead(200, { "content-type": "text/plain" }).end(name);
    if (req.url === "/slow") setTimeout(answer, SLOW_MS);
    else answer();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, dial: `127.0.0.1:${(server.address() as AddressInfo).port}` };
}

interface Reply {
  status: number;
  body: string;
}

/**
 * A request to the router with `host` in the Host header (fetch may not set Host). A failure
 * says whether it went out on a reused keep-alive connection.
 */
function get(host: string, urlPath = "/", agent: http.Agent | false = false): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port: httpPort, path: urlPath, headers: { host }, agent, timeout: 5000 }, (res) => {
      let body = "";
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error(`no answer for ${host}${urlPath}`)));
    req.on("error", (err) => reject(Object.assign(err, { reusedSocket: req.reusedSocket })));
    req.end();
  });
}

/**
 * A keep-alive client as browsers, curl and Go's client are: a request whose reused connection
 * was closed before any answer is sent again once (RFC 9112 section 9.3.1; Node leaves this to
 * the caller, see `request.reusedSocket`). Caddy's config change needs it: the old config closes
 * its idle keep-alive connections, and a request written to one at that instant was never read.
 */
async function getKeepAlive(host: string, agent: http.Agent, onRetry: () => void): Promise<Reply> {
  try {
    return await get(host, "/", agent);
  } catch (err) {
    const { reusedSocket, code } = err as { reusedSocket?: boolean; code?: string };
    if (!reusedSocket || code !== "ECONNRESET") throw err;
    onRetry();
    return get(host, "/", agent);
  }
}

/**
 * What the router serves at `host` and `path`, as soon as it serves the config just written:
 * Caddy's old config still answers a connection it accepted in the moment the admin API returned.
 */
function served(host: string, urlPath = "/") {
  return expect.poll(() => get(host, urlPath), { timeout: 3_000 });
}

function frontDoor(colour: "blue" | "green", key = "grp/app/main", hosts = [HOST]): RouteSpec {
  return { key, hosts, mounts: [{ service: "web", path: "/", upstreams: [upstreams[colour].dial] }] };
}

/** A change made by hand through Caddy's admin API, as an operator with curl would; answers Caddy's reply. */
async function byHand(method: string, urlPath: string, body?: unknown): Promise<unknown> {
  const res = await caddyAdmin(caddy.adminUrl, method, urlPath, { body: body === undefined ? undefined : JSON.stringify(body), timeoutMs: 10_000 });
  expect(res.status, res.text).toBe(200);
  return res.text === "" ? null : (JSON.parse(res.text) as unknown);
}

const SERVER = "/config/apps/http/servers/platform";

async function startOwnCaddy(): Promise<StartedCaddy> {
  // The admin API on a socket, as npm start and test fleets run it.
  return startCaddy({ adminSocket: path.join(dataDir, "admin.sock"), httpPort, dataDir, log: () => undefined });
}

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(os.tmpdir(), "agent-router-test-"));
  [httpPort] = (await freePorts(1)) as [number];
  [upstreams.blue, upstreams.green, upstreams.api] = await Promise.all([upstream("blue"), upstream("green"), upstream("api")]);
  caddy = await startOwnCaddy();
  router = new CaddyRouter({ adminUrl: caddy.adminUrl, listenPort: httpPort });
});

afterAll(async () => {
  await caddy?.stop();
  for (const u of Object.values(upstreams)) u.server.closeAllConnections();
  await Promise.all(Object.values(upstreams).map((u) => new Promise((resolve) => u.server.close(resolve))));
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe("route ids", () => {
  it("keep any key recoverable: safe characters as they are, every other byte as _xx", () => {
    expect(routeId("grp/app/main")).toBe("fd-grp_2fapp_2fmain");
    expect(routeId("a_b.c-D")).toBe("fd-a_5fb.c-D");
    for (const key of ["grp/app/main", "a_b.c-D", "ünï/cödé", "x%20y", "_"]) expect(keyOfRouteId(routeId(key))).toBe(key);
    expect(keyOfRouteId("other")).toBeUndefined();
    expect(keyOfRouteId("fd-bad_zz")).toBeUndefined();
  });
});

describe("CaddyRouter on a real Caddy", () => {
  it("assertAll serves a front door on plain HTTP; any other host gets 404", async () => {
    await router.assertAll([frontDoor("blue")]);
    await served(HOST).toEqual({ status: 200, body: "blue" });
    await served(HOST, "/any/path").toEqual({ status: 200, body: "blue" });
    await served("nothing.t.localhost").toEqual({ status: 404, body: NOT_FOUND_BODY });
    expect(await router.current()).toEqual(["grp/app/main"]);
  });

  it("assertAll replaces the whole table", async () => {
    await router.assertAll([frontDoor("green", "other", ["other.t.localhost"]), frontDoor("blue")]);
    expect((await router.current())?.sort()).toEqual(["grp/app/main", "other"]);
    await router.assertAll([frontDoor("blue")]);
    expect(await router.current()).toEqual(["grp/app/main"]);
    await served("other.t.localhost").toMatchObject({ status: 404 });
  });

  it("path mounts: the longest mount wins, /api serves /api and below but not /apix", async () => {
    await router.put({
      key: "mounts",
      hosts: ["mounts.t.localhost"],
      mounts: [
        { service: "web", path: "/", upstreams: [upstreams.blue.dial] },
        { service: "api", path: "/api", upstreams: [upstreams.api.dial] },
        { service: "docs", path: "/api/docs", upstreams: [] },
        { service: "v1", path: "/v1.0", upstreams: [upstreams.api.dial] },
      ],
    });
    const h = "mounts.t.localhost";
    await served(h, "/api/x").toEqual({ status: 200, body: "api" });
    await served(h, "/api").toEqual({ status: 200, body: "api" });
    await served(h, "/apix").toEqual({ status: 200, body: "blue" });
    // Paths are case-sensitive; a path is matched once cleaned.
    await served(h, "/API/x").toEqual({ status: 200, body: "blue" });
    await served(h, "/Api").toEqual({ status: 200, body: "blue" });
    await served(h, "//api//x").toEqual({ status: 200, body: "api" });
    await served(h, "/web/../api/x").toEqual({ status: 200, body: "api" });
    // A mount path is matched literally.
    await served(h, "/v1.0/x").toEqual({ status: 200, body: "api" });
    await served(h, "/v1x0/x").toEqual({ status: 200, body: "blue" });
    await served(h, "/").toEqual({ status: 200, body: "blue" });
    await served(h, "/api/docs/v1").toEqual({ status: 503, body: NO_REPLICA_BODY });
    await served(HOST).toEqual({ status: 200, body: "blue" });
    expect((await router.current())?.sort()).toEqual(["grp/app/main", "mounts"]);
  });

  it("a front door without a / mount answers 404 outside its mounts; several upstreams take turns", async () => {
    await router.put({
      key: "api-only",
      hosts: ["api-only.t.localhost"],
      mounts: [{ service: "api", path: "/api", upstreams: [upstreams.blue.dial, upstreams.green.dial] }],
    });
    await served("api-only.t.localhost", "/").toEqual({ status: 404, body: NO_MOUNT_BODY });
    const bodies = new Set<string>();
    for (let i = 0; i < 4; i++) bodies.add((await get("api-only.t.localhost", "/api")).body);
    expect([...bodies].sort()).toEqual(["blue", "green"]);
    await router.remove("api-only");
  });

  it("put flips blue to green without failing a request: keep-alive loop and one in flight", async () => {
    await router.put(frontDoor("blue"));
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const seen: string[] = [];
    const failures: string[] = [];
    let retries = 0;
    // A slow request that the old config is still serving when the flip lands.
    const inFlight = get(HOST, "/slow");
    let flipDone = false;
    const flip = sleep(SLOW_MS / 3)
      .then(() => router.put(frontDoor("green")))
      .finally(() => (flipDone = true));
    let afterFlip = 0;
    while (afterFlip < 50 && seen.length + failures.length < 5000) {
      try {
        const reply = await getKeepAlive(HOST, agent, () => retries++);
        if (reply.status === 200) seen.push(reply.body);
        else failures.push(`${reply.status} ${reply.body}`);
      } catch (err) {
        failures.push(String(err));
      }
      if (flipDone) afterFlip++;
    }
    await flip;
    agent.destroy();

    expect(failures).toEqual([]);
    // One connection, one config change: at most its one idle connection was closed under a request.
    expect(retries).toBeLessThanOrEqual(1);
    expect(await inFlight).toEqual({ status: 200, body: "blue" });
    // Traffic switches once: blue until the flip, then only green.
    const firstGreen = seen.indexOf("green");
    expect(firstGreen).toBeGreaterThan(0);
    expect(seen.slice(firstGreen).every((b) => b === "green")).toBe(true);
    await served(HOST).toEqual({ status: 200, body: "green" });
  });

  it("remove stops serving a front door and is idempotent", async () => {
    await router.remove("mounts");
    await served("mounts.t.localhost", "/api").toMatchObject({ status: 404 });
    await router.remove("mounts");
    await router.remove("never-existed");
    expect(await router.current()).toEqual(["grp/app/main"]);
  });

  it("drift: none for the table asked for, whatever order Caddy keeps its keys and front doors in", async () => {
    const other = frontDoor("blue", "other", ["other.t.localhost"]);
    await router.assertAll([frontDoor("green")]);
    // put adds a front door at index 0: Caddy holds them in the other order than asked below.
    await router.put(other);
    expect(await router.current()).toEqual(["other", "grp/app/main"]);
    // Caddy answers with the keys of each object sorted, not in the order they were written.
    expect(Object.keys((await byHand("GET", `/id/${routeId("other")}`)) as object)).toEqual(["@id", "handle", "match", "terminal"]);
    expect(await router.drift([frontDoor("green"), other])).toBeNull();

    expect(await router.drift([frontDoor("green")])).toEqual({ absent: false, missing: [], extra: ["other"], changed: [], server: false });
    const third = frontDoor("blue", "third", ["third.t.localhost"]);
    expect(await router.drift([frontDoor("green"), other, third])).toEqual({ absent: false, missing: ["third"], extra: [], changed: [], server: false });
    expect(await router.drift([frontDoor("blue"), other])).toEqual({ absent: false, missing: [], extra: [], changed: ["grp/app/main"], server: false });
  });

  it("drift: a front door deleted, changed or doubled by hand through the admin API, one hidden behind the catch-all", async () => {
    const table = [frontDoor("green"), frontDoor("blue", "other", ["other.t.localhost"])];
    const asserted = { absent: false, missing: [], extra: [], changed: [], server: false };

    await router.assertAll(table);
    await byHand("DELETE", `/id/${routeId("other")}`);
    expect(await router.drift(table)).toEqual({ ...asserted, missing: ["other"] });

    await router.assertAll(table);
    await byHand("PATCH", `/id/${routeId("grp/app/main")}/handle/0/routes/0/handle/0/upstreams`, [{ dial: upstreams.blue.dial }]);
    await served(HOST).toEqual({ status: 200, body: "blue" });
    expect(await router.drift(table)).toEqual({ ...asserted, changed: ["grp/app/main"] });

    // Caddy takes a second route with an id it holds: the front door is not what was asked.
    await router.assertAll(table);
    await byHand("PUT", `${SERVER}/routes/0`, frontDoorRoute(table[1]!));
    expect(await router.drift(table)).toEqual({ ...asserted, changed: ["other"] });

    // Appended after the catch-all, a front door is never reached; so is a route of no front door.
    await router.assertAll(table);
    await byHand("POST", `${SERVER}/routes`, frontDoorRoute(frontDoor("blue", "late", ["late.t.localhost"])));
    await served("late.t.localhost").toEqual({ status: 404, body: NOT_FOUND_BODY });
    expect(await router.drift(table)).toEqual({ ...asserted, extra: ["late"], server: true });

    await router.assertAll(table);
    await byHand("PUT", `${SERVER}/routes/0`, { handle: [{ handler: "static_response", status_code: 418 }] });
    expect(await router.drift(table)).toEqual({ ...asserted, server: true });

    await router.assertAll([frontDoor("green")]);
    expect(await router.drift([frontDoor("green")])).toBeNull();
    await served(HOST).toEqual({ status: 200, body: "green" });
  });

  it("refuses a route it cannot express, before calling Caddy", async () => {
    const bad = (path: string): RouteSpec => ({ key: "bad", hosts: ["bad.t.localhost"], mounts: [{ service: "web", path, upstreams: [] }] });
    await expect(router.put(bad("/api/"))).rejects.toThrow(/mount path/);
    await expect(router.put(bad("api"))).rejects.toThrow(/mount path/);
    await expect(router.put({ key: "bad", hosts: [], mounts: [] })).rejects.toThrow(/no host/);
    await expect(router.assertAll([frontDoor("blue"), frontDoor("green")])).rejects.toThrow(/listed twice/);
    expect(await router.current()).toEqual(["grp/app/main"]);
  });

  it("after a Caddy restart: unreachable while down, null when back empty, assertAll restores routing", async () => {
    await caddy.stop();
    await expect(router.current()).rejects.toThrow(`Caddy admin API at ${caddy.adminUrl} is not reachable`);

    caddy = await startOwnCaddy();
    expect(await router.current()).toBeNull();
    expect(await router.drift([frontDoor("green")])).toEqual({ absent: true, missing: ["grp/app/main"], extra: [], changed: [], server: true });
    await expect(router.put(frontDoor("green"))).rejects.toThrow(/holds no 'platform' server/);
    expect(await router.current()).toBeNull();

    await router.assertAll([frontDoor("green")]);
    expect(await router.current()).toEqual(["grp/app/main"]);
    await served(HOST).toEqual({ status: 200, body: "green" });
  });

  it("an error of the admin API carries Caddy's message", async () => {
    const other = new CaddyRouter({ adminUrl: caddy.adminUrl, listenPort: 70000 });
    await expect(other.assertAll([])).rejects.toThrow(/Caddy admin API: POST \/config\/apps\/http\/servers\/platform answered \d+: .*70000/);
    await served(HOST).toEqual({ status: 200, body: "green" });
  });
});
