/**
 * Failures of moving a stream between ZFS and the store that are neither zfs's (ZfsError) nor
 * the store's (StoreError): what was downloaded or received is not what the manifest promised.
 */

/** Why a restore was refused; callers switch on this, never on message text. */
export type ReplicateErrorKind =
  /** The downloaded stream's size or SHA-256 differs from its manifest's: the stored bytes changed. */
  | "checksum"
  /** The manifests do not form one chain (a full stream, then each incremental on the one before). */
  | "chain"
  /** zfs received the stream but the snapshot it made has another guid than the manifest's. */
  | "guid"
  /**
   * The received stream decided properties (source `received`) that the plugin or the
   * operator's policy decides: the stream was not made by the plugin (stream_properties.ts).
   */
  | "properties";

/** A refused or failed restore. The message names the store key or snapshot concerned. */
export class ReplicateError extends Error {
  readonly kind: ReplicateErrorKind;

  constructor(kind: ReplicateErrorKind, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ReplicateError";
    this.kind = kind;
  }
}
