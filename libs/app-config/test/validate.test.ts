import { describe, it, expect } from "vitest";
import { checkAppConfig, validateAppConfig } from "../src/index.ts";
import { containerConfig, expectHas, expectOne, staticConfig } from "./fixtures.ts";

describe("validateAppConfig: the whole document", () => {
  it("accepts the ARCHITECTURE example and a static app", () => {
    expect(validateAppConfig(containerConfig())).toEqual([]);
    expect(validateAppConfig(staticConfig())).toEqual([]);
  });

  it("accepts a minimal container app: one HTTP service with run and port", () => {
    expect(validateAppConfig({ services: { web: { run: "node s.js", port: 3000 } } })).toEqual([]);
  });

  it("accepts a container app with only a background service", () => {
    expect(validateAppConfig({ services: { worker: { run: "node w.js", background: true } } })).toEqual([]);
  });

  it.each([null, [], "text", 42, true, undefined])("refuses a root that is not a mapping: %j", (value) => {
    expectOne(validateAppConfig(value), "not_a_mapping");
  });

  it("refuses unknown top-level keys with their path and a hint for a near miss", () => {
    const config = { ...containerConfig(), databse: { enabled: true }, extra: 1 };
    const problems = validateAppConfig(config);
    expect(problems).toHaveLength(2);
    expect(expectHas(problems, "unknown_key", "databse").message).toContain('did you mean "database"');
    expect(expectHas(problems, "unknown_key", "extra").message).not.toContain("did you mean");
  });

  it("returns every problem, not just the first", () => {
    const config = containerConfig();
    config.services.web.port = 0;
    config.services.web.replicas = 9;
    config.database = { enabled: "yes" };
    config.cron[0].schedule = "* * *";
    config.storage.drives[0].size_gb = 101;
    const problems = validateAppConfig(config);
    expect(problems.map((p) => `${p.code}@${p.path}`).sort()).toEqual([
      "invalid_format@cron[0].schedule",
      "out_of_range@services.web.port",
      "out_of_range@services.web.replicas",
      "out_of_range@storage.drives[0].size_gb",
      "wrong_type@database.enabled",
    ]);
  });

  it("checkAppConfig narrows to the value itself or returns the problems", () => {
    const config = containerConfig();
    const ok = checkAppConfig(config);
    expect(ok.ok && ok.config).toBe(config);
    const bad = checkAppConfig({ services: {} });
    expect(bad.ok).toBe(false);
    if (!bad.ok) expectOne(bad.errors, "required", "services");
  });
});

describe("validateAppConfig: type", () => {
  it("defaults to container (services required)", () => {
    expectOne(validateAppConfig({}), "required", "services");
  });

  it("refuses another string with invalid_value, a non-string with wrong_type", () => {
    const config = containerConfig();
    config.type = "vm";
    expectOne(validateAppConfig(config), "invalid_value", "type");
    config.type = 1;
    expectOne(validateAppConfig(config), "wrong_type", "type");
  });

  it("skips the type-dependent rules when type is invalid, but still checks fields", () => {
    const problems = validateAppConfig({ type: "vm", services: { web: { port: "80" } }, static: { dir: "dist" } });
    expect(problems.map((p) => `${p.code}@${p.path}`)).toEqual(["invalid_value@type", "wrong_type@services.web.port"]);
  });
});

describe("validateAppConfig: services", () => {
  it("requires at least one service in a container app", () => {
    expectOne(validateAppConfig({ type: "container" }), "required", "services");
    expectOne(validateAppConfig({ services: {} }), "required", "services");
  });

  it("refuses services that are not a mapping, and a service that is not a mapping", () => {
    expectOne(validateAppConfig({ services: [{ run: "x", port: 1 }] }), "wrong_type", "services");
    expectOne(validateAppConfig({ services: { web: "node s.js" } }), "wrong_type", "services.web");
    expectOne(validateAppConfig({ services: { web: null } }), "wrong_type", "services.web");
  });

  it.each(["web", "a", "api-2", "w" + "x".repeat(39)])("accepts the service name %s", (name) => {
    expect(validateAppConfig({ services: { [name]: { run: "x", port: 1 } } })).toEqual([]);
  });

  it.each([
    ["Web", "services.Web"],
    ["2web", "services[\"2web\"]"],
    ["-web", "services[\"-web\"]"],
    ["web-", "services.web-"],
    ["my_web", "services.my_web"],
    ["my.web", "services[\"my.web\"]"],
    ["w" + "x".repeat(40), `services.w${"x".repeat(40)}`],
  ])("refuses the service name %s at %s", (name, path) => {
    expectOne(validateAppConfig({ services: { [name]: { run: "x", port: 1 } } }), "invalid_format", path);
  });

  it("refuses unknown service keys (typos do not pass silently)", () => {
    const config = containerConfig();
    config.services.web.prot = 80;
    config.services.web.replica = 2;
    const problems = validateAppConfig(config);
    expect(problems).toHaveLength(2);
    expect(expectHas(problems, "unknown_key", "services.web.prot").message).toContain('"port"');
    expect(expectHas(problems, "unknown_key", "services.web.replica").message).toContain('"replicas"');
  });

  it("requires run in a container app", () => {
    const config = containerConfig();
    delete config.services.worker.run;
    expectOne(validateAppConfig(config), "required", "services.worker.run");
  });

  it.each([
    ["run", 1, "wrong_type"],
    ["run", "", "out_of_range"],
    ["run", "   ", "out_of_range"],
    ["run", "x".repeat(4097), "out_of_range"],
    ["build", false, "wrong_type"],
    ["build", "", "out_of_range"],
    ["build", "x".repeat(4097), "out_of_range"],
  ])("checks the command %s = %j (%s)", (key, value, code) => {
    const config = containerConfig();
    config.services.web[key] = value;
    expectOne(validateAppConfig(config), code, `services.web.${key}`);
  });

  it("accepts commands of 4096 characters and a service without build", () => {
    const config = containerConfig();
    config.services.web.run = "x".repeat(4096);
    delete config.services.web.build;
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("requires a port on a service that is not background", () => {
    const config = containerConfig();
    delete config.services.web.port;
    expectOne(validateAppConfig(config), "required", "services.web.port");
    config.services.web.background = false;
    expectOne(validateAppConfig(config), "required", "services.web.port");
  });

  it.each([
    [1, null],
    [65535, null],
    [0, "out_of_range"],
    [65536, "out_of_range"],
    [-1, "out_of_range"],
    [80.5, "wrong_type"],
    ["8080", "wrong_type"],
    [true, "wrong_type"],
    [null, "wrong_type"],
  ])("port %j -> %s", (port, code) => {
    const config = containerConfig();
    config.services.web.port = port;
    const problems = validateAppConfig(config);
    if (code === null) expect(problems).toEqual([]);
    else expectOne(problems, code, "services.web.port");
  });

  it.each([
    [1, null],
    [3, null],
    [0, "out_of_range"],
    [4, "out_of_range"],
    [1.5, "wrong_type"],
    ["2", "wrong_type"],
  ])("replicas %j -> %s", (replicas, code) => {
    const config = containerConfig();
    config.services.web.replicas = replicas;
    const problems = validateAppConfig(config);
    if (code === null) expect(problems).toEqual([]);
    else expectOne(problems, code, "services.web.replicas");
  });

  it.each([
    [64, null],
    [8192, null],
    [63, "out_of_range"],
    [8193, "out_of_range"],
    [256.5, "wrong_type"],
    ["256", "wrong_type"],
  ])("memory_mb %j -> %s", (memory, code) => {
    const config = containerConfig();
    config.services.worker.memory_mb = memory;
    const problems = validateAppConfig(config);
    if (code === null) expect(problems).toEqual([]);
    else expectOne(problems, code, "services.worker.memory_mb");
  });

  it.each(["/", "/healthz", "/api/health?full=1", "/a/b/c"])("accepts the health path %s", (health) => {
    const config = containerConfig();
    config.services.web.health = health;
    expect(validateAppConfig(config)).toEqual([]);
  });

  it.each([
    ["healthz", "invalid_format"],
    ["", "out_of_range"],
    ["/has space", "invalid_format"],
    ["/x#frag", "invalid_format"],
    ["/" + "x".repeat(512), "out_of_range"],
    [1, "wrong_type"],
  ])("refuses the health path %j (%s)", (health, code) => {
    const config = containerConfig();
    config.services.web.health = health;
    expectOne(validateAppConfig(config), code, "services.web.health");
  });

  it.each(["/", "/api", "/api/v2", "/a.b_c~d-e"])("accepts the mount %s", (mount) => {
    const config = containerConfig();
    config.services.web.mount = mount;
    expect(validateAppConfig(config)).toEqual([]);
  });

  it.each([
    ["api", "invalid_format"],
    ["/api/", "invalid_format"],
    ["//api", "invalid_format"],
    ["/api?x=1", "invalid_format"],
    ["/a b", "invalid_format"],
    ["/api/../admin", "invalid_format"],
    ["/.", "invalid_format"],
    ["", "out_of_range"],
    [true, "wrong_type"],
  ])("refuses the mount %j (%s)", (mount, code) => {
    const config = containerConfig();
    config.services.web.mount = mount;
    expectOne(validateAppConfig(config), code, "services.web.mount");
  });

  it("refuses background that is not a boolean", () => {
    const config = containerConfig();
    config.services.worker.background = "yes";
    const problems = validateAppConfig(config);
    // Not a boolean, so the service counts as an HTTP service and also lacks its port.
    expect(problems.map((p) => `${p.code}@${p.path}`).sort()).toEqual([
      "required@services.worker.port",
      "wrong_type@services.worker.background",
    ]);
  });

  it.each(["port", "health", "mount"])("refuses %s on a background service", (key) => {
    const config = containerConfig();
    config.services.worker[key] = key === "port" ? 9000 : "/x";
    expectOne(validateAppConfig(config), "not_allowed", `services.worker.${key}`);
  });

  it("allows replicas, memory_mb and build on a background service", () => {
    const config = containerConfig();
    Object.assign(config.services.worker, { replicas: 2, memory_mb: 512, build: "make" });
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("allows at most one service mounted at /", () => {
    const config = containerConfig();
    config.services.api = { run: "node api.js", port: 8081, mount: "/" };
    const problem = expectOne(validateAppConfig(config), "duplicate", "services.api.mount");
    expect(problem.message).toContain("At most one service can be mounted at /");
    expect(problem.message).toContain('"web"');
  });

  it("refuses two services sharing a mount, allows nested mounts", () => {
    const config = containerConfig();
    config.services.api = { run: "node api.js", port: 8081, mount: "/api" };
    config.services.admin = { run: "node admin.js", port: 8082, mount: "/api" };
    expectOne(validateAppConfig(config), "duplicate", "services.admin.mount");
    config.services.admin.mount = "/api/admin";
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("allows several unrouted HTTP services", () => {
    const config = containerConfig();
    config.services.internal = { run: "node i.js", port: 9000 };
    config.services.other = { run: "node o.js", port: 9001 };
    expect(validateAppConfig(config)).toEqual([]);
  });
});

describe("validateAppConfig: static apps", () => {
  it("requires static when type is static", () => {
    const config = staticConfig();
    delete config.static;
    expectOne(validateAppConfig(config), "required", "static");
  });

  it("refuses static on a container app (explicit or default type)", () => {
    const config = containerConfig();
    config.static = { dir: "dist" };
    expectOne(validateAppConfig(config), "not_allowed", "static");
    delete config.type;
    expectOne(validateAppConfig(config), "not_allowed", "static");
  });

  it("needs no services", () => {
    const config = staticConfig();
    delete config.services;
    expect(validateAppConfig(config)).toEqual([]);
    config.services = {};
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("allows one build-only service: no run, no port", () => {
    const config = staticConfig();
    config.services = { site: {} };
    expect(validateAppConfig(config)).toEqual([]);
  });

  it.each([
    ["run", "node s.js"],
    ["port", 80],
    ["health", "/h"],
    ["replicas", 2],
    ["memory_mb", 128],
    ["mount", "/"],
    ["background", true],
  ])("refuses %s on a static app's service", (key, value) => {
    const config = staticConfig();
    config.services.site[key] = value;
    expectOne(validateAppConfig(config), "not_allowed", `services.site.${key}`);
  });

  it("refuses unknown keys on a static app's service", () => {
    const config = staticConfig();
    config.services.site.buid = "x";
    expectOne(validateAppConfig(config), "unknown_key", "services.site.buid");
  });

  it("refuses a second service in a static app", () => {
    const config = staticConfig();
    config.services.docs = { build: "make docs" };
    expectOne(validateAppConfig(config), "not_allowed", "services.docs");
  });

  it("refuses drives, cron and enabled database, cache or email", () => {
    const config = staticConfig();
    config.storage = { drives: [{ name: "d", size_gb: 1, mount: "/data" }], buckets: [{ name: "media" }] };
    config.cron = [{ name: "n", schedule: "* * * * *", path: "/" }];
    config.database = { enabled: true };
    config.cache = { enabled: true };
    config.email = { enabled: false };
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`).sort()).toEqual([
      "not_allowed@cache.enabled",
      "not_allowed@cron",
      "not_allowed@database.enabled",
      "not_allowed@storage.drives",
    ]);
  });

  it("allows empty drives and cron lists and buckets", () => {
    const config = staticConfig();
    config.storage = { drives: [], buckets: [{ name: "media" }] };
    config.cron = [];
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("checks the static block", () => {
    const config = staticConfig();
    config.static = { dir: "dist", spa_fallback: "yes", index_document: "a/b.html", error_document: "404.html" };
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`).sort()).toEqual([
      "invalid_format@static.index_document",
      "unknown_key@static.error_document",
      "wrong_type@static.spa_fallback",
    ]);
  });

  it("requires static.dir and refuses static that is not a mapping", () => {
    const config = staticConfig();
    config.static = { spa_fallback: true };
    expectOne(validateAppConfig(config), "required", "static.dir");
    config.static = "dist";
    expectOne(validateAppConfig(config), "wrong_type", "static");
  });

  it.each(["dist", ".", "./dist", "web/build", "public_html"])("accepts static.dir %s", (dir) => {
    const config = staticConfig();
    config.static.dir = dir;
    expect(validateAppConfig(config)).toEqual([]);
  });

  it.each([
    ["/dist", "invalid_format"],
    ["../dist", "invalid_format"],
    ["web/../../etc", "invalid_format"],
    ["dist/", "invalid_format"],
    ["", "out_of_range"],
    [3, "wrong_type"],
  ])("refuses static.dir %j (%s)", (dir, code) => {
    const config = staticConfig();
    config.static.dir = dir;
    expectOne(validateAppConfig(config), code, "static.dir");
  });

  it.each([
    ["index.htm", null],
    ["..", "invalid_format"],
    ["", "out_of_range"],
    [1, "wrong_type"],
  ])("index_document %j -> %s", (doc, code) => {
    const config = staticConfig();
    config.static.index_document = doc;
    const problems = validateAppConfig(config);
    if (code === null) expect(problems).toEqual([]);
    else expectOne(problems, code, "static.index_document");
  });
});

describe("validateAppConfig: database, cache, email", () => {
  it.each(["database", "cache", "email"])("%s must be { enabled: boolean }", (key) => {
    const config = containerConfig();
    config[key] = { enabled: false };
    expect(validateAppConfig(config)).toEqual([]);
    config[key] = true;
    expectOne(validateAppConfig(config), "wrong_type", key);
    config[key] = {};
    expectOne(validateAppConfig(config), "required", `${key}.enabled`);
    config[key] = { enabled: "true" };
    expectOne(validateAppConfig(config), "wrong_type", `${key}.enabled`);
    config[key] = { enabled: true, size: 1 };
    expectOne(validateAppConfig(config), "unknown_key", `${key}.size`);
  });

  it("are optional", () => {
    const config = containerConfig();
    delete config.database;
    delete config.cache;
    delete config.email;
    expect(validateAppConfig(config)).toEqual([]);
  });
});

describe("validateAppConfig: storage", () => {
  it("is optional, with optional drives and buckets", () => {
    const config = containerConfig();
    config.storage = {};
    expect(validateAppConfig(config)).toEqual([]);
    delete config.storage;
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("refuses a storage that is not a mapping, lists that are not lists, unknown keys", () => {
    const config = containerConfig();
    config.storage = [];
    expectOne(validateAppConfig(config), "wrong_type", "storage");
    config.storage = { drives: { name: "x" }, buckets: "media", volumes: [] };
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "unknown_key@storage.volumes",
      "wrong_type@storage.drives",
      "wrong_type@storage.buckets",
    ]);
  });

  it("requires every drive field", () => {
    const config = containerConfig();
    config.storage.drives = [{}];
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "required@storage.drives[0].name",
      "required@storage.drives[0].size_gb",
      "required@storage.drives[0].mount",
    ]);
  });

  it("refuses a drive that is not a mapping and unknown drive keys", () => {
    const config = containerConfig();
    config.storage.drives = ["uploads", { name: "a", size_gb: 1, mount: "/a", size: 2 }];
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "wrong_type@storage.drives[0]",
      "unknown_key@storage.drives[1].size",
    ]);
  });

  it.each([
    [1, null],
    [100, null],
    [0, "out_of_range"],
    [101, "out_of_range"],
    [1.5, "wrong_type"],
    ["1", "wrong_type"],
  ])("size_gb %j -> %s", (size, code) => {
    const config = containerConfig();
    config.storage.drives[0].size_gb = size;
    const problems = validateAppConfig(config);
    if (code === null) expect(problems).toEqual([]);
    else expectOne(problems, code, "storage.drives[0].size_gb");
  });

  it.each([
    ["data/uploads", "invalid_format"],
    ["/", "invalid_format"],
    ["/data/", "invalid_format"],
    ["/data/../etc", "invalid_format"],
    ["/proc", "not_allowed"],
    ["/sys/fs", "not_allowed"],
    ["/dev/shm", "not_allowed"],
    ["", "out_of_range"],
    [5, "wrong_type"],
  ])("refuses the drive mount %j (%s)", (mount, code) => {
    const config = containerConfig();
    config.storage.drives[0].mount = mount;
    expectOne(validateAppConfig(config), code, "storage.drives[0].mount");
  });

  it("accepts /process and /device-data (only the reserved roots are refused)", () => {
    const config = containerConfig();
    config.storage.drives = [
      { name: "a", size_gb: 1, mount: "/process" },
      { name: "b", size_gb: 1, mount: "/device-data" },
    ];
    expect(validateAppConfig(config)).toEqual([]);
  });

  it("refuses duplicate drive names and mounts", () => {
    const config = containerConfig();
    config.storage.drives = [
      { name: "uploads", size_gb: 1, mount: "/data/uploads" },
      { name: "uploads", size_gb: 2, mount: "/data/other" },
      { name: "third", size_gb: 2, mount: "/data/uploads" },
    ];
    const problems = validateAppConfig(config);
    expect(problems.map((p) => `${p.code}@${p.path}`).sort()).toEqual([
      "duplicate@storage.drives[1].name",
      "duplicate@storage.drives[2].mount",
    ]);
    expect(expectHas(problems, "duplicate", "storage.drives[1].name").message).toContain("storage.drives[0]");
  });

  it("refuses invalid drive and bucket names", () => {
    const config = containerConfig();
    config.storage.drives[0].name = "Uploads";
    config.storage.buckets[0].name = "media_files";
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "invalid_format@storage.drives[0].name",
      "invalid_format@storage.buckets[0].name",
    ]);
  });

  it("checks buckets: mapping, name required, known keys, unique names", () => {
    const config = containerConfig();
    config.storage.buckets = ["media", {}, { name: "a", public: true }, { name: "a" }];
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "wrong_type@storage.buckets[0]",
      "required@storage.buckets[1].name",
      "unknown_key@storage.buckets[2].public",
      "duplicate@storage.buckets[3].name",
    ]);
  });
});

describe("validateAppConfig: cron", () => {
  it("is an optional list", () => {
    const config = containerConfig();
    config.cron = [];
    expect(validateAppConfig(config)).toEqual([]);
    config.cron = { nightly: {} };
    expectOne(validateAppConfig(config), "wrong_type", "cron");
  });

  it("requires name, schedule and path; enabled is optional", () => {
    const config = containerConfig();
    config.cron = [{}, { name: "a", schedule: "* * * * *", path: "/a" }];
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "required@cron[0].name",
      "required@cron[0].schedule",
      "required@cron[0].path",
    ]);
  });

  it("refuses a job that is not a mapping, unknown keys, a bad enabled", () => {
    const config = containerConfig();
    config.cron = ["nightly", { name: "a", schedule: "* * * * *", path: "/a", enabled: "no", command: "x" }];
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "wrong_type@cron[0]",
      "unknown_key@cron[1].command",
      "wrong_type@cron[1].enabled",
    ]);
  });

  it("validates the schedule syntax", () => {
    const config = containerConfig();
    config.cron[0].schedule = "@daily";
    expect(expectOne(validateAppConfig(config), "invalid_format", "cron[0].schedule").message).toContain("5 fields");
    config.cron[0].schedule = "0 24 * * *";
    expect(expectOne(validateAppConfig(config), "invalid_format", "cron[0].schedule").message).toContain("hour");
    config.cron[0].schedule = 5;
    expectOne(validateAppConfig(config), "wrong_type", "cron[0].schedule");
  });

  it("checks the path and the name", () => {
    const config = containerConfig();
    config.cron[0].path = "cron/nightly";
    config.cron[0].name = "Nightly";
    expect(validateAppConfig(config).map((p) => `${p.code}@${p.path}`)).toEqual([
      "invalid_format@cron[0].name",
      "invalid_format@cron[0].path",
    ]);
  });

  it("refuses duplicate job names", () => {
    const config = containerConfig();
    config.cron.push({ name: "nightly", schedule: "0 4 * * *", path: "/other" });
    expectOne(validateAppConfig(config), "duplicate", "cron[1].name");
  });
});
