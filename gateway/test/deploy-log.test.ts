import { describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { LogRowSchema } from "@platform/proto";
import { phasesOfShippedLines } from "../src/domain/deploy-log.ts";

const row = (id: number, phase: string | null, message: string, serviceName?: string) =>
  create(LogRowSchema, { id: BigInt(id), message, serviceName, metadataJson: JSON.stringify(phase ? { phase } : {}) });

describe("deploy log of a deployment in flight", () => {
  it("groups the shipped lines by phase, in the order the phases began, lines oldest first", () => {
    // Newest first, as the log store answers.
    const rows = [row(5, "health_check", "answers /healthz", "web"), row(4, "start", "Started replica 2", "web"), row(3, "start", "Started replica 1", "web"), row(2, null, "no phase"), row(1, "setup", "Deploying web:main-1")];
    expect(phasesOfShippedLines(rows)).toEqual([
      { name: "setup", output: "Deploying web:main-1" },
      { name: "start", output: "[web] Started replica 1\n[web] Started replica 2" },
      { name: "health_check", output: "[web] answers /healthz" },
    ]);
    expect(phasesOfShippedLines([])).toEqual([]);
  });
});
