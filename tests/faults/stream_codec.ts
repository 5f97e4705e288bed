/**
 * The bytes the model pool's `zfs send` writes and its `zfs receive` reads: a small header and
 * JSON. A full stream carries the snapshot's whole content and some padding (a full stream is
 * the volume's size, an increment only its delta: uploads of full streams take longer); an
 * incremental one names its base's guid and carries only what was written after the base. Like
 * ZFS, a stream keeps the snapshot's name, guid and creation time, never the dataset's
 * properties (the plugin sends without -p).
 */

const MAGIC = "ZSIM1\n";

/** What one stream says. */
export interface SimStream {
  /** Guid of the base snapshot; null for a full stream. */
  readonly from: string | null;
  readonly guid: string;
  /** The snapshot's name (after the "@"). */
  readonly name: string;
  /** Unix seconds, as the sending node's clock said when the snapshot was taken. */
  readonly creation: number;
  /** The writes the snapshot holds after the base's (all of them for a full stream). */
  readonly data: readonly string[];
}

/** Bytes of padding a full stream carries: the notional size of the volume's data. */
export const FULL_PADDING_BYTES = 16 * 1024;

/** Encodes a stream; a full one is padded. */
export function encodeStream(s: SimStream): Uint8Array {
  const body = JSON.stringify(s);
  const pad = s.from === null ? " ".repeat(FULL_PADDING_BYTES) : "";
  return new TextEncoder().encode(`${MAGIC}${body}\n${pad}`);
}

/**
 * Decodes a stream.
 * @throws {SyntaxError} for bytes that are not one (zfs: "invalid backup stream")
 */
export function decodeStream(bytes: Uint8Array): SimStream {
  const text = new TextDecoder().decode(bytes);
  if (!text.startsWith(MAGIC)) throw new SyntaxError("invalid backup stream");
  const end = text.indexOf("\n", MAGIC.length);
  if (end < 0) throw new SyntaxError("invalid backup stream");
  const v = JSON.parse(text.slice(MAGIC.length, end)) as SimStream;
  if (
    typeof v.guid !== "string" || typeof v.name !== "string" || !Array.isArray(v.data) ||
    (v.from !== null && typeof v.from !== "string") || typeof v.creation !== "number"
  ) {
    throw new SyntaxError("invalid backup stream");
  }
  return v;
}
