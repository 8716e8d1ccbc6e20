import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, it, expect } from "vitest";
import {
  ConfigError,
  FLEET_ENV,
  gatewayEnv,
  loadConfig,
  serviceEnv,
  type EnvSpec,
} from "../src/index.ts";

/** Asserts `fn` throws the one-line ConfigError that names `variable`. */
function expectConfigError(fn: () => unknown, variable: string): ConfigError {
  let caught: unknown;
  try {
    fn();
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(ConfigError);
  const err = caught as ConfigError;
  expect(err.variable).toBe(variable);
  expect(err.message.startsWith(`Invalid environment variable ${variable}: `)).toBe(true);
  expect(err.message).not.toContain("\n");
  return err;
}

const spec = {
  NAME: { type: "string", description: "a name" },
  HOME_URL: { type: "url", description: "a web page" },
  DB_URL: { type: "postgres-url", description: "a database" },
  BUS_URL: { type: "nats-url", description: "a bus" },
  LISTEN: { type: "port", description: "a port" },
  COUNT: { type: "int", description: "a count" },
  ENABLED: { type: "bool", description: "a switch" },
  MODE: { type: "enum", values: ["fast", "slow"], description: "a mode" },
} as const satisfies EnvSpec;

const good = {
  NAME: "n",
  HOME_URL: "https://example.com/x",
  DB_URL: "postgres://u@h:5432/db",
  BUS_URL: "nats://127.0.0.1:4222",
  LISTEN: "8080",
  COUNT: "42",
  ENABLED: "yes",
  MODE: "slow",
};

describe("loadConfig", () => {
  it("parses valid values into their types", () => {
    const config = loadConfig(spec, good);
    expect(config).toEqual({
      NAME: "n",
      HOME_URL: "https://example.com/x",
      DB_URL: "postgres://u@h:5432/db",
      BUS_URL: "nats://127.0.0.1:4222",
      LISTEN: 8080,
      COUNT: 42,
      ENABLED: true,
      MODE: "slow",
    });
    expect(Object.isFrozen(config)).toBe(true);
    expect(loadConfig(spec, { ...good, ENABLED: "0", DB_URL: "postgresql://h/db", BUS_URL: "tls://h:4222" }).ENABLED).toBe(false);
    expect(loadConfig(spec, { ...good, LISTEN: "0" }).LISTEN).toBe(0);
    expect(loadConfig(spec, { ...good, LISTEN: "65535" }).LISTEN).toBe(65535);
  });

  it("fails on a missing required variable with one line naming it", () => {
    const { NAME: _omit, ...rest } = good;
    const err = expectConfigError(() => loadConfig(spec, rest), "NAME");
    expect(err.message).toBe("Invalid environment variable NAME: is required (a name)");
    // An empty value counts as unset.
    expectConfigError(() => loadConfig(spec, { ...good, COUNT: "" }), "COUNT");
  });

  const bad: Array<[keyof typeof good, string]> = [
    ["HOME_URL", "not a url"],
    ["HOME_URL", "ftp://example.com"],
    ["DB_URL", "http://h/db"],
    ["DB_URL", "::"],
    ["BUS_URL", "http://127.0.0.1:4222"],
    ["LISTEN", "http"],
    ["LISTEN", "65536"],
    ["LISTEN", "-1"],
    ["LISTEN", "80.5"],
    ["COUNT", "1e3"],
    ["COUNT", "ten"],
    ["COUNT", "99999999999999999999"],
    ["ENABLED", "maybe"],
    ["MODE", "medium"],
  ];
  it.each(bad)("fails on %s=%j with one line naming it", (name, value) => {
    const err = expectConfigError(() => loadConfig(spec, { ...good, [name]: value }), name);
    expect(err.message).toContain(value.length > 60 ? value.slice(0, 57) : value);
  });

  it("shortens a very long bad value in the message", () => {
    const long = "x".repeat(500);
    const err = expectConfigError(() => loadConfig(spec, { ...good, COUNT: long }), "COUNT");
    expect(err.message.length).toBeLessThan(200);
  });

  it("applies defaults when unset or empty, and parses them", () => {
    const withDefaults = {
      PORT: { type: "port", default: "7001", description: "p" },
      FLAG: { type: "bool", default: "false", description: "f" },
      LEVEL: { type: "enum", values: ["a", "b"], default: "b", description: "l" },
    } as const satisfies EnvSpec;
    expect(loadConfig(withDefaults, {})).toEqual({ PORT: 7001, FLAG: false, LEVEL: "b" });
    expect(loadConfig(withDefaults, { PORT: "", FLAG: "", LEVEL: "" })).toEqual({ PORT: 7001, FLAG: false, LEVEL: "b" });
    expect(loadConfig(withDefaults, { PORT: "9", FLAG: "true", LEVEL: "a" })).toEqual({ PORT: 9, FLAG: true, LEVEL: "a" });
    // A set value is still validated even when a default exists.
    expectConfigError(() => loadConfig(withDefaults, { PORT: "nope" }), "PORT");
  });

  it("reads an unset optional variable as undefined, and validates it when set", () => {
    const optional = { HOOK: { type: "url", optional: true, description: "h" } } as const satisfies EnvSpec;
    const config = loadConfig(optional, {});
    expect(config.HOOK).toBeUndefined();
    expect(Object.keys(config)).toEqual(["HOOK"]);
    expect(loadConfig(optional, { HOOK: "" }).HOOK).toBeUndefined();
    expect(loadConfig(optional, { HOOK: "http://h" }).HOOK).toBe("http://h");
    expectConfigError(() => loadConfig(optional, { HOOK: "h" }), "HOOK");
  });

  it("reads a list of networks, each an address with or without a prefix length", () => {
    const nets = { DENIED: { type: "cidr-list", optional: true, description: "d" } } as const satisfies EnvSpec;
    expect(loadConfig(nets, { DENIED: " 10.0.0.0/8, 192.0.2.7 ,fd00::/8," }).DENIED).toBe("10.0.0.0/8,192.0.2.7,fd00::/8");
    for (const bad of ["10.0.0.0/33", "fd00::/129", "db.internal", "10.0.0.0/8/1", "10.0.0.0/x"]) {
      const err = expectConfigError(() => loadConfig(nets, { DENIED: `10.0.0.0/8,${bad}` }), "DENIED");
      expect(err.message).toContain(`(got '${bad}')`);
    }
  });

  it("reads a range of ports, first-last, from 1024 to 65535", () => {
    const ports = { PORTS: { type: "port-range", default: "20000-29999", description: "p" } } as const satisfies EnvSpec;
    expect(loadConfig(ports, {}).PORTS).toBe("20000-29999");
    expect(loadConfig(ports, { PORTS: " 4000 - 4000 " }).PORTS).toBe("4000-4000");
    for (const bad of ["80-90", "30000-20000", "20000-70000", "20000", "a-b"]) {
      expect(expectConfigError(() => loadConfig(ports, { PORTS: bad }), "PORTS").message).toContain(`(got '${bad}')`);
    }
  });

  it("loads every process of the fleet from an empty environment", () => {
    for (const [name, processSpec] of Object.entries(FLEET_ENV)) {
      expect(() => loadConfig(processSpec, {}), name).not.toThrow();
    }
    const identity = loadConfig(serviceEnv("identity"), {});
    expect(identity.RPC_PORT).toBe(7001);
    expect(identity.BUS_PREFIX).toBe("");
    expect(identity.OTEL_EXPORTER_OTLP_ENDPOINT).toBeUndefined();
    expect(loadConfig(gatewayEnv, {}).HEALTH_AGGREGATOR_URL).toBe("http://127.0.0.1:7008");
    expectConfigError(() => loadConfig(gatewayEnv, { HEALTH_AGGREGATOR_URL: "health-aggregator:7008" }), "HEALTH_AGGREGATOR_URL");
    expectConfigError(() => loadConfig(serviceEnv("mailer"), { DATABASE_URL: "mysql://h/db" }), "DATABASE_URL");
    expectConfigError(() => loadConfig(serviceEnv("mailer"), { LOG_LEVEL: "loud" }), "LOG_LEVEL");
  });
});

describe("loadConfigOrExit", () => {
  const moduleUrl = new URL("../src/index.ts", import.meta.url).href;
  const script = `
    import { loadConfigOrExit } from ${JSON.stringify(moduleUrl)};
    const config = loadConfigOrExit({
      TEST_PORT: { type: "port", description: "port of the test" },
      TEST_NAME: { type: "string", default: "anon", description: "name" },
    });
    process.stdout.write(JSON.stringify(config));
  `;
  function run(env: Record<string, string>) {
    const clean: Record<string, string> = {};
    for (const k of ["PATH", "HOME", "SYSTEMROOT"]) if (process.env[k]) clean[k] = process.env[k];
    return spawnSync(process.execPath, ["--input-type=module", "-e", script], {
      env: { ...clean, ...env },
      encoding: "utf8",
      cwd: fileURLToPath(new URL("..", import.meta.url)),
      timeout: 20_000,
    });
  }

  it("exits 1 printing exactly one stderr line naming the variable", () => {
    const result = run({ TEST_PORT: "99999" });
    expect(result.status).toBe(1);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe("Invalid environment variable TEST_PORT: must be a port between 0 and 65535 (got '99999')\n");
  });

  it("exits 1 naming a missing variable", () => {
    const result = run({});
    expect(result.status).toBe(1);
    expect(result.stderr).toBe("Invalid environment variable TEST_PORT: is required (port of the test)\n");
  });

  it("returns the config when it is valid", () => {
    const result = run({ TEST_PORT: "1234" });
    expect(result.stderr).toBe("");
    expect(result.status).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({ TEST_PORT: 1234, TEST_NAME: "anon" });
  });
});
