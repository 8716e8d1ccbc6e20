import type { ConfigProblem } from "./types.ts";

/**
 * One problem as a person reads it: where it is (line and column; the path when the message
 * does not name it already), then what is wrong.
 */
export function problemText(p: ConfigProblem): string {
  const where = p.line ? `line ${p.line}, column ${p.column ?? 1}: ` : "";
  return `${where}${p.path && !p.message.includes(p.path) ? `${p.path}: ` : ""}${p.message}`;
}

/**
 * A config's problems for a one-line error message (a build's or a deploy's error_message): how
 * many, then the first `max` of them in the file's order, so that fixing what it names is not
 * followed by another failure for a problem it left out.
 */
export function problemsSummary(problems: readonly ConfigProblem[], max = 5): string {
  if (problems.length === 0) return "no problem was named.";
  const inFileOrder = [...problems].sort((a, b) => (a.line ?? Infinity) - (b.line ?? Infinity));
  const shown = inFileOrder.slice(0, max).map((p) => problemText(p).replace(/\.$/, ""));
  const rest = problems.length - shown.length;
  return `${problems.length} problem${problems.length === 1 ? "" : "s"}: ${shown.join("; ")}${rest > 0 ? `; and ${rest} more` : ""}.`;
}
