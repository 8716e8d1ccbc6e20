/** The log line contract: validation and normalisation, and decoding a batch message. */
import { describe, expect, it } from "vitest";
import {
  MAX_MESSAGE_CHARS,
  MAX_METADATA_CHARS,
  TRUNCATION_MARK,
  decodeLogBatch,
  isHexOrHyphenId,
  storableText,
  validateLogLine,
  type LogLineResult,
} from "../src/index.ts";

const base = { ts: "2026-11-20T10:00:00.000Z", source: "agent", level: "info", message: "hello" };

function valid(result: LogLineResult) {
  if (!result.ok) throw new Error(`expected a valid line, got: ${result.error}`);
  return result.line;
}

function refused(result: LogLineResult) {
  if (result.ok) throw new Error("expected a refusal");
  return result.error;
}

describe("validateLogLine", () => {
  it("fills absent nullable fields with null and metadata with {}", () => {
    expect(valid(validateLogLine(base))).toEqual({
      id: null,
      ts: "2026-11-20T10:00:00.000Z",
      source: "agent",
      level: "info",
      app_name: null,
      branch: null,
      group_slug: null,
      service_name: null,
      deployment_id: null,
      build_id: null,
      action_id: null,
      instance_id: null,
      message: "hello",
      metadata: {},
    });
  });

  it("keeps every field of a full line, with ids lowercased and ts in UTC", () => {
    const line = valid(
      validateLogLine({
        ...base,
        id: "0B4E3C0A-1111-4222-8333-444455556666",
        ts: "2026-11-20T12:00:00+02:00",
        source: "build",
        level: "error",
        app_name: "shop",
        branch: "main",
        group_slug: "acme",
        service_name: "web",
        deployment_id: "DEAD-beef",
        build_id: "0123abcd-0000",
        action_id: "ffff",
        instance_id: "host-1",
        metadata: { step: 3, nested: { ok: true } },
      }),
    );
    expect(line).toMatchObject({
      id: "0b4e3c0a-1111-4222-8333-444455556666",
      ts: "2026-11-20T10:00:00.000Z",
      deployment_id: "dead-beef",
      build_id: "0123abcd-0000",
      action_id: "ffff",
      metadata: { step: 3, nested: { ok: true } },
    });
  });

  it("treats empty strings of nullable fields as null", () => {
    expect(valid(validateLogLine({ ...base, app_name: "", build_id: "", group_slug: null }))).toMatchObject({ app_name: null, build_id: null, group_slug: null });
  });

  it("refuses what cannot be a log line", () => {
    expect(refused(validateLogLine(null))).toMatch(/object/);
    expect(refused(validateLogLine([base]))).toMatch(/object/);
    expect(refused(validateLogLine({ ...base, source: "kernel" }))).toMatch(/source must be one of agent, deploy, build, container, backup/);
    expect(refused(validateLogLine({ ...base, level: "debug" }))).toMatch(/level must be one of info, warning, error/);
    expect(refused(validateLogLine({ ...base, message: 42 }))).toMatch(/message/);
    expect(refused(validateLogLine({ ...base, message: undefined }))).toMatch(/message/);
    expect(refused(validateLogLine({ ...base, ts: "yesterday" }))).toMatch(/ts/);
    expect(refused(validateLogLine({ ...base, ts: undefined }))).toMatch(/ts/);
    expect(refused(validateLogLine({ ...base, ts: "+275760-09-13T00:00:00.000Z" }))).toMatch(/ts/);
    expect(refused(validateLogLine({ ...base, build_id: "not-hex!" }))).toMatch(/build_id/);
    expect(refused(validateLogLine({ ...base, deployment_id: "a".repeat(65) }))).toMatch(/deployment_id/);
    expect(refused(validateLogLine({ ...base, app_name: 7 }))).toMatch(/app_name/);
    expect(refused(validateLogLine({ ...base, app_name: "x".repeat(257) }))).toMatch(/app_name/);
    expect(refused(validateLogLine({ ...base, id: "line-1" }))).toMatch(/id must be a UUID/);
    expect(refused(validateLogLine({ ...base, metadata: [1, 2] }))).toMatch(/metadata/);
  });

  it("cuts an over-long message and marks the cut", () => {
    const line = valid(validateLogLine({ ...base, message: "x".repeat(MAX_MESSAGE_CHARS * 2) }));
    expect(line.message).toHaveLength(MAX_MESSAGE_CHARS);
    expect(line.message.endsWith(TRUNCATION_MARK)).toBe(true);
  });

  it("replaces oversized metadata by a marker", () => {
    const line = valid(validateLogLine({ ...base, metadata: { blob: "y".repeat(MAX_METADATA_CHARS) } }));
    expect(line.metadata).toMatchObject({ truncated: true });
  });

  it("makes text storable in Postgres: NUL and lone surrogates are replaced, in metadata keys and values too", () => {
    const line = valid(validateLogLine({ ...base, message: "a\u0000b\ud800c", metadata: { "k\u0000": "v\udc00", n: Number.NaN, d: new Date(0) } }));
    expect(line.message).toBe("a\uFFFDb\uFFFDc");
    expect(line.metadata).toEqual({ "k\uFFFD": "v\uFFFD", n: null, d: "1970-01-01T00:00:00.000Z" });
    expect(storableText("fine ✓ 🎉")).toBe("fine ✓ 🎉");
  });
});

describe("isHexOrHyphenId", () => {
  it("accepts hex digits and hyphens only", () => {
    expect(isHexOrHyphenId("0b4e3c0a-1111-4222-8333-444455556666")).toBe(true);
    expect(isHexOrHyphenId("ABCDEF")).toBe(true);
    expect(isHexOrHyphenId("")).toBe(false);
    expect(isHexOrHyphenId("g123")).toBe(false);
    expect(isHexOrHyphenId("abc' or 1=1")).toBe(false);
  });
});

describe("decodeLogBatch", () => {
  it("reads an array of lines, keeping the valid ones and the index of each refused one", () => {
    const decoded = decodeLogBatch(JSON.stringify([base, { ...base, level: "loud" }, { ...base, message: "two" }]));
    expect(decoded.lines.map((l) => l.message)).toEqual(["hello", "two"]);
    expect(decoded.rejected).toEqual([{ index: 1, error: expect.stringMatching(/level/) }]);
  });

  it("reads one line object, from bytes too", () => {
    expect(decodeLogBatch(new TextEncoder().encode(JSON.stringify(base))).lines).toHaveLength(1);
  });

  it("throws on a payload that is not JSON or neither shape", () => {
    expect(() => decodeLogBatch("{nope")).toThrow(/not JSON/);
    expect(() => decodeLogBatch("42")).toThrow(/array of lines or one line object/);
  });
});
