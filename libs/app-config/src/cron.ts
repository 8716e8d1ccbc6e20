/**
 * Five-field cron schedules: `minute hour day-of-month month day-of-week`, as in crontab(5).
 * Each field is a comma-separated list of `*`, `n`, `a-b`, `* /s` (without the space) or `a-b/s`.
 * Months accept jan-dec, days of the week sun-sat (any case); day of week 0 and 7 are both Sunday.
 * Not accepted: `@daily`-style macros, seconds or year fields, Quartz extensions (`?`, `L`, `W`,
 * `#`), and a step after a single value (`5/10`).
 */

interface CronField {
  label: string;
  min: number;
  max: number;
  names?: readonly string[];
}

const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

const FIELDS: readonly CronField[] = [
  { label: "minute", min: 0, max: 59 },
  { label: "hour", min: 0, max: 23 },
  { label: "day of month", min: 1, max: 31 },
  { label: "month", min: 1, max: 12, names: MONTHS },
  { label: "day of week", min: 0, max: 7, names: DAYS },
];

const PART = /^(\*|([0-9]+|[A-Za-z]{3})(?:-([0-9]+|[A-Za-z]{3}))?)(?:\/([0-9]+))?$/;

function fieldValue(token: string, field: CronField): number | null {
  if (/^[0-9]+$/.test(token)) {
    if (token.length > 2) return null;
    const n = Number(token);
    return n >= field.min && n <= field.max ? n : null;
  }
  if (!field.names) return null;
  const index = field.names.indexOf(token.toLowerCase());
  if (index < 0) return null;
  // Month names count from 1, day names from 0 (sun).
  return field.min === 1 ? index + 1 : index;
}

function checkField(text: string, field: CronField): string | null {
  for (const part of text.split(",")) {
    const m = PART.exec(part);
    if (!m) return `the ${field.label} field has an invalid part "${part}"`;
    const [, head, from, to, step] = m;
    if (head !== "*") {
      const a = fieldValue(from ?? "", field);
      if (a === null) return `the ${field.label} field value "${from}" is outside ${field.min}-${field.max}`;
      if (to !== undefined) {
        const b = fieldValue(to, field);
        if (b === null) return `the ${field.label} field value "${to}" is outside ${field.min}-${field.max}`;
        if (a > b) return `the ${field.label} field range "${from}-${to}" runs backwards`;
      } else if (step !== undefined) {
        return `the ${field.label} field step "${part}" needs * or a range before the slash`;
      }
    }
    if (step !== undefined) {
      const s = Number(step);
      if (step.length > 2 || s < 1 || s > field.max) {
        return `the ${field.label} field step "${step}" is outside 1-${field.max}`;
      }
    }
  }
  return null;
}

/** Null when `schedule` is a valid five-field cron expression, else the reason (a phrase). */
export function checkCronSchedule(schedule: string): string | null {
  const fields = schedule.trim().split(/\s+/);
  if (schedule.trim() === "" || fields.length !== FIELDS.length) {
    return `a schedule has 5 fields (minute hour day-of-month month day-of-week), this one has ${schedule.trim() === "" ? 0 : fields.length}`;
  }
  for (let i = 0; i < FIELDS.length; i += 1) {
    const problem = checkField(fields[i] ?? "", FIELDS[i] as CronField);
    if (problem) return problem;
  }
  return null;
}
