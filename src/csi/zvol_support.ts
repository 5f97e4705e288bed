/**
 * Whether this plugin serves zvols: the operator's --block-volumes, and whether this node's zfs
 * can make them (zfs-fuse cannot), probed once. Both services ask it before anything touches a
 * zvol, and it says why not in words an operator can act on.
 */

import { Code, CsiError } from "../errors.ts";
import { requestedContentOf } from "./zvol_request.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { BLOCK_VOLUMES_OFF_MESSAGE, type CapabilityOptions } from "./validate.ts";
import type { VolumeCapability } from "./types.ts";
import type { ZvolContent } from "../volume/zvol.ts";

/** The message of a node whose zfs cannot make zvols. */
export const NO_ZVOLS_MESSAGE =
  "Block volumes are not supported on this node: this node's zfs cannot make zvols (zfs-fuse, " +
  'or OpenZFS older than 0.8); serve ZFS datasets (fs_type "zfs" or none) instead';

/** The operator's switch and the node's zfs, for zvols. */
export class ZvolSupport {
  readonly #enabled: boolean;
  readonly #zfs: Zfs;

  constructor(enabled: boolean, zfs: Zfs) {
    this.#enabled = enabled;
    this.#zfs = zfs;
  }

  /** What checkCapability may accept. */
  get options(): CapabilityOptions {
    return { blockVolumes: this.#enabled };
  }

  /**
   * Returns when zvols may be served here.
   * @throws {CsiError} INVALID_ARGUMENT saying why not (the flag is off, or zfs cannot)
   */
  async check(): Promise<void> {
    if (!this.#enabled) throw new CsiError(Code.INVALID_ARGUMENT, BLOCK_VOLUMES_OFF_MESSAGE);
    if (!await this.#zfs.canMakeZvols()) {
      throw new CsiError(Code.INVALID_ARGUMENT, NO_ZVOLS_MESSAGE);
    }
  }

  /** What a CreateVolume asks for (zvol_request.ts), with this plugin's options. */
  requested(
    caps: readonly VolumeCapability[] | null | undefined,
    parameters: Readonly<Record<string, string>>,
  ): ZvolContent | undefined {
    return requestedContentOf(caps, parameters, this.options);
  }
}
