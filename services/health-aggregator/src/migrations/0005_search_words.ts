import { Migration } from "@platform/db";

/**
 * Full-text search finds a word wherever it stands: `healthz` in "answers /healthz", `build` and
 * `info` in "dist/build-info.txt". Postgres' parser keeps a path, a URL or a hyphenated name as
 * one token, so the words inside it could not be searched for. Punctuation now separates words,
 * in the stored vector and in the search text alike (SEARCH_WORD_SEPARATORS in log-query.ts).
 */
export class SearchWords extends Migration {
  override up(): void {
    this.addSql("drop index if exists log_lines_message_tsv");
    this.addSql("alter table log_lines drop column message_tsv");
    this.addSql(
      "alter table log_lines add column message_tsv tsvector generated always as (to_tsvector('simple', regexp_replace(message, '[[:punct:]]+', ' ', 'g'))) stored",
    );
    this.addSql("create index log_lines_message_tsv on log_lines using gin (message_tsv)");
  }
}

export const searchWordsMigrations = [{ name: "0005_search_words", class: SearchWords }];
