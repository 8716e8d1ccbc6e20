/** What went wrong, for a log line or an action's error message: an Error's message, or the thrown value as text. */
export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
