/**
 * The follow zvol kind's CreateVolume: a volume that follows its job (follow.ts) and is a zvol
 * (zvol.ts), raw or holding ext4/xfs (docs/block-volumes.md). CreateVolume touches no node: the
 * owner object and record go to the store with what every node makes an identical zvol with
 * (its content, volsize, volblocksize when asked, sparse, the volume properties zvols take),
 * under the same parameter policy as a zvol here. From a stored snapshot: a zvol's only,
 * holding the same, never smaller. The other calls of a follow zvol are the follow kind's
 * (they act on the store), and its node side is node_follow_zvol.ts.
 */

import { MIN_VOLUME_BYTES } from "../../size.ts";
import type { FollowZvol } from "../../follow/owner.ts";
import {
  parseZvolParameters,
  planZvolSize,
  ZVOL_CONTENT_PROPERTY,
  type ZvolContent,
} from "../../volume/zvol.ts";
import { Code, CsiError } from "../../errors.ts";
import type { CreateVolumeRequest } from "../types.ts";
import type { KindCommon } from "./common.ts";
import type { FollowKind, FollowShape } from "./follow.ts";
import { checkZvolSource } from "./stored.ts";

/** CreateVolume of follow zvols (the rest is FollowKind's). */
export class FollowZvolKind {
  readonly #c: KindCommon;
  readonly #follow: FollowKind;

  constructor(common: KindCommon, follow: FollowKind) {
    this.#c = common;
    this.#follow = follow;
  }

  /**
   * CreateVolume of a follow volume holding `content`, asked for by its capabilities or its
   * fs_type parameter (`parameters` less follow). Refused before anything is written where
   * this plugin serves no zvols (without --block-volumes, on zfs-fuse).
   */
  create(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
    content: ZvolContent,
  ): Promise<unknown> {
    return this.#follow.createShaped(req, requested, parameters, async (rest) => {
      await this.#c.zvols.check();
      return zvolShape(this.#c, rest, content);
    });
  }
}

/** The zvol's side of a follow CreateVolume (follow.ts FollowShape). */
function zvolShape(c: KindCommon, rest: Record<string, string>, content: ZvolContent): FollowShape {
  const zvol = parseZvolParameters(rest, { allowSparse: c.d.config.allowSparseZvols });
  // As a zvol here (zvol.ts): every parameter, sorted, is what a repeat is known by.
  const canonical = JSON.stringify(
    Object.fromEntries(Object.entries(rest).sort(([a], [b]) => (a < b ? -1 : 1))),
  );
  return {
    rest: { ...zvol.rest },
    context: { fs_type: content },
    size(capacity, _params, fromSnapshot) {
      const asked = capacity.requiredBytes > 0 || capacity.limitBytes > 0;
      // From a snapshot without a size: the snapshot's volsize (seed.ts, below).
      return fromSnapshot && !asked ? 0 : planZvolSize(capacity, content, MIN_VOLUME_BYTES);
    },
    canonical: () => canonical,
    checkSource() {
      if (zvol.volblocksize !== undefined) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          `Parameter volblocksize does not apply to a volume made from a stored snapshot: it ` +
            `keeps its source's`,
        );
      }
    },
    checkSeed(id, snapshot, asked) {
      checkZvolSource(id, snapshot, content, asked);
      // Its volsize becomes the volume's (untrusted, and a zvol's size is never 0).
      if (!Number.isSafeInteger(snapshot.capacityBytes) || snapshot.capacityBytes <= 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Snapshot "${id}" records no size of its zvol: a volume that follows its job cannot be ` +
            `made from it`,
        );
      }
    },
    settings(props, _params, size) {
      const spec: FollowZvol = {
        content,
        sparse: zvol.sparse,
        ...(zvol.volblocksizeBytes === undefined ? {} : { volblocksize: zvol.volblocksizeBytes }),
      };
      // Its content is recorded on every copy, as on any zvol the plugin makes (zvol.ts).
      return {
        capacityBytes: size,
        properties: { ...props, [ZVOL_CONTENT_PROPERTY]: content },
        zvol: spec,
      };
    },
  };
}
