import { describe, it, expect } from "vitest";
import { checkCronSchedule } from "../src/index.ts";

describe("checkCronSchedule", () => {
  it.each([
    "* * * * *",
    "0 3 * * *",
    "*/15 * * * *",
    "0 0 1 1 0",
    "59 23 31 12 7",
    "0 9-17 * * mon-fri",
    "0 9-17/2 * * MON-FRI",
    "0,15,30,45 * * * *",
    "0 0 1 jan,jul *",
    "5 4 * * sun",
    "  0   3 * *   *  ",
    "0 0 */31 * *",
  ])("accepts %j", (schedule) => {
    expect(checkCronSchedule(schedule)).toBeNull();
  });

  it.each([
    ["", "5 fields"],
    ["* * * *", "5 fields"],
    ["* * * * * *", "5 fields"],
    ["@daily", "5 fields"],
    ["60 * * * *", "minute"],
    ["* 24 * * *", "hour"],
    ["* * 0 * *", "day of month"],
    ["* * 32 * *", "day of month"],
    ["* * * 0 *", "month"],
    ["* * * 13 *", "month"],
    ["* * * * 8", "day of week"],
    ["* * * foo *", "month"],
    ["* * * * mon-", "day of week"],
    ["* * * jan *", null],
    ["* * * * jan", "day of week"],
    ["*/0 * * * *", "step"],
    ["*/60 * * * *", "step"],
    ["5/10 * * * *", "slash"],
    ["10-5 * * * *", "backwards"],
    ["* * ? * *", "day of month"],
    ["* * L * *", "day of month"],
    ["* * * * 1#2", "day of week"],
    ["0,,5 * * * *", "minute"],
    ["001 * * * *", "minute"],
    ["-1 * * * *", "minute"],
  ])("judges %j (%s)", (schedule, reason) => {
    const result = checkCronSchedule(schedule);
    if (reason === null) expect(result).toBeNull();
    else expect(result).toContain(reason);
  });
});
