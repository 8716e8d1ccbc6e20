/** `since` of GET /api/builds (spec doc 1 section 4.3), ISO 8601, a date or a timestamp; and a build's duration_seconds (section 2.2). */
import { describe, expect, it } from "vitest";
import { buildDuration, parseSince } from "../src/domain/builds.ts";

describe("since", () => {
  it("takes a date as its midnight in UTC, and a timestamp with Z, an offset or none (UTC)", () => {
    expect(parseSince("2026-11-24").toISOString()).toBe("2026-11-24T00:00:00.000Z");
    expect(parseSince("2026-11-24T09:30").toISOString()).toBe("2026-11-24T09:30:00.000Z");
    expect(parseSince("2026-11-24T09:30:15").toISOString()).toBe("2026-11-24T09:30:15.000Z");
    expect(parseSince("2026-11-24T09:30:15.123456Z").toISOString()).toBe("2026-11-24T09:30:15.123Z");
    expect(parseSince("2026-11-24T09:30:15+02:00").toISOString()).toBe("2026-11-24T07:30:15.000Z");
    expect(parseSince("2026-11-24T09:30:15-0130").toISOString()).toBe("2026-11-24T11:00:15.000Z");
  });

  it("refuses what is not ISO 8601, or names a day or time that does not exist (or one before year 1), with 422", () => {
    for (const bad of ["yesterday", "1h", "24/11/2026", "Nov 24 2026", "2026-02-30", "2026-13-01", "2026-11-24T24:00", "2026-11-24T09:61", "", "0000-01-01", "0001-01-01T00:30+01:00"]) {
      expect(() => parseSince(bad), bad).toThrow(expect.objectContaining({ status: 422 }));
    }
  });
});

describe("duration_seconds", () => {
  const at = (s: number) => new Date(Date.UTC(2026, 10, 24, 9, 0, s));
  it("counts the seconds run so far while a build runs, and keeps the final figure once it ended", () => {
    expect(buildDuration({ startedAt: at(0), completedAt: null, durationSeconds: null }, at(42))).toBe(42);
    expect(buildDuration({ startedAt: at(0), completedAt: at(30), durationSeconds: null }, at(42))).toBe(30);
    expect(buildDuration({ startedAt: at(0), completedAt: at(30), durationSeconds: 31 }, at(42))).toBe(31);
  });

  it("is 0 for a build no agent has taken, queued or cancelled in the queue", () => {
    expect(buildDuration({ startedAt: null, completedAt: null, durationSeconds: null }, at(42))).toBe(0);
    expect(buildDuration({ startedAt: null, completedAt: at(5), durationSeconds: null }, at(42))).toBe(0);
  });
});
