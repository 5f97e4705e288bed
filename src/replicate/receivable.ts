/**
 * Before stored streams are received: whether this node's pool can receive their form
 * (src/zfs/stream_form.ts), so that a node without OpenZFS's features says so, naming the form
 * and what it lacks, before anything is received, instead of zfs failing part way through a
 * chain. A plain stream (every manifest written before forms, every stream from zfs-fuse) asks
 * nothing of the pool, and zfs is not even asked what it has.
 */

import { Code, CsiError } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { describeForm, missingForReceive, neededFeatures, PLAIN_FORM } from "../zfs/stream_form.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** The pool of a dataset name. */
function poolOf(dataset: string): string {
  return dataset.split(/[/@]/, 1)[0]!;
}

/**
 * Refuses a chain of stored streams that the pool of `target` cannot receive. A refusal reads
 * the pool's features again first (an upgrade since the last read counts).
 * @throws {CsiError} FAILED_PRECONDITION naming the first stream refused, its form and what the
 *   pool lacks
 * @throws {ZfsError} when zpool cannot read the pool
 */
export async function checkReceivable(
  zfs: Pick<Zfs, "streamSupport">,
  target: string,
  chain: readonly SnapshotManifest[],
): Promise<void> {
  const asking = chain.filter((m) => m.form && neededFeatures(m.form).length > 0);
  if (asking.length === 0) return;
  const pool = poolOf(target);
  let support = await zfs.streamSupport(pool);
  const refused = () =>
    asking.map((m) => ({ m, missing: missingForReceive(support, m.form!) }))
      .find((r) => r.missing.length > 0);
  if (!refused()) return;
  support = await zfs.streamSupport(pool, { fresh: true });
  const first = refused();
  if (!first) return;
  const { m, missing } = first;
  throw new CsiError(
    Code.FAILED_PRECONDITION,
    `This node cannot receive stored snapshot "${m.snapshot}" (guid ${m.guid}) of volume ` +
      `"${m.volume}": it is a ${describeForm(m.form ?? PLAIN_FORM, m.raw)}, and pool "${pool}" ` +
      `lacks ${missing.join("; ")}. Nothing was received. Restore or stage it on a node whose ` +
      `zfs and pool have them (OpenZFS; "zpool set feature@<name>=enabled ${pool}" enables one)`,
  );
}
