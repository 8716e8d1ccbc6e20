/**
 * The per-phase output of a deployment still in flight (spec doc 1 section 4.5). The queue has a
 * deploy's phases once it has ended (the agent reports them with its completion); until then they
 * are read from the lines the agent shipped to the log store, each tagged with its phase.
 */
import type { LogRow } from "@platform/proto";
import { lineText } from "./build-log.ts";

function phaseOf(row: LogRow): string | null {
  try {
    const phase = (JSON.parse(row.metadataJson || "{}") as { phase?: unknown }).phase;
    return typeof phase === "string" && phase ? phase : null;
  } catch {
    return null;
  }
}

/** `rows` newest first, as the log store answers; phases in the order they began, lines as the agent words them. */
export function phasesOfShippedLines(rows: LogRow[]): Array<{ name: string; output: string }> {
  const phases = new Map<string, string[]>();
  for (const row of [...rows].reverse()) {
    const phase = phaseOf(row);
    if (!phase) continue;
    const lines = phases.get(phase) ?? [];
    lines.push(lineText(row));
    phases.set(phase, lines);
  }
  return [...phases].map(([name, lines]) => ({ name, output: lines.join("\n") }));
}
