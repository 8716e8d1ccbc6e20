/**
 * What ingestion stores for one NATS message of the LOGS stream: its valid lines, each with
 * its line id. The shipper's id when the line has one; otherwise a UUID derived from the
 * message's place in the stream (stream name, stream sequence, index among its valid lines),
 * which is the same on every redelivery. Either way a line delivered twice is stored once.
 */
import { createHash } from "node:crypto";
import { decodeLogBatch, type ValidLogLine } from "@platform/logship";

export interface StoredLine extends Omit<ValidLogLine, "id"> {
  line_id: string;
}

export interface MessageLines {
  lines: StoredLine[];
  rejected: Array<{ index: number; error: string }>;
}

/** A stable UUID (version 5 layout, SHA-1) for a line that came without an id. */
export function derivedLineId(stream: string, seq: number, index: number): string {
  const hex = createHash("sha1").update(`${stream}/${seq}/${index}`).digest("hex");
  const variant = ((parseInt(hex.slice(16, 18), 16) & 0x3f) | 0x80).toString(16);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-5${hex.slice(13, 16)}-${variant}${hex.slice(18, 20)}-${hex.slice(20, 32)}`;
}

/** The lines of one message; throws when the message can never be stored (not JSON, wrong shape). */
export function linesOfMessage(payload: Uint8Array | string, stream: string, seq: number): MessageLines {
  const decoded = decodeLogBatch(payload);
  return {
    lines: decoded.lines.map(({ id, ...line }, index) => ({ ...line, line_id: id ?? derivedLineId(stream, seq, index) })),
    rejected: decoded.rejected,
  };
}
