/**
 * Cutting text that travels on the bus (log lines, event payloads) and ends up in Postgres, which
 * refuses a lone half of a surrogate pair in jsonb (and a text column would hold U+FFFD instead).
 */

/** `end`, or one less when cutting there would split a surrogate pair. */
export function pairSafeEnd(text: string, end: number): number {
  if (end <= 0 || end >= text.length) return end;
  const code = text.charCodeAt(end - 1);
  return code >= 0xd800 && code <= 0xdbff ? end - 1 : end;
}
