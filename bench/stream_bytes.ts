/**
 * The byte rows of section 8: what a stored stream costs against what the pool holds, on the
 * machine's own ZFS. A volume with compression (lz4 on OpenZFS; gzip on zfs-fuse, which has no
 * lz4) holding text-like data is backed up through the plugin to a directory store, then an
 * eighth of it rewritten and backed up again: the increment, which is what a move of the volume
 * sends (the same send path: src/replicate/backup.ts). Each stored stream is set against the
 * space its data takes in the pool (`used`, or its growth) and against the plain `zfs send` of
 * the same snapshots, which is what every stream cost before compressed sends. On OpenZFS the
 * streams go `-c -L -e` (target: at most 1.05x used); on zfs-fuse they stay plain (no change).
 *
 * Byte counts do not depend on the machine's speed: they are exact in the OpenZFS VM too
 * (tests/integration/store_stream_form_test.ts measures the same there).
 */

import { formFlags } from "../src/zfs/stream_form.ts";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { measureStreamCosts, openZfs, type StreamCost } from "../tests/support/stream_bytes.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";
import { mib } from "./bench_io.ts";
import { ratio, type Row } from "./stats.ts";

/** The bound on stored bytes against the pool's `used` for compressed streams. */
const TARGET = 1.05;

/** Rows of stored bytes against the pool's, for a volume of `dataMiB` of text-like data. */
export async function streamBytesRows(options: {
  readonly dataMiB: number;
  readonly section: string;
  readonly progress: (text: string) => void;
}): Promise<Row[]> {
  const { dataMiB, section, progress } = options;
  const openzfs = await openZfs();
  const compression = openzfs ? "lz4" : "gzip";
  progress(`store: stored bytes of ${dataMiB} MiB of text, compression=${compression}`);
  await using pool = await TestPool.create(1024 + dataMiB * 3);
  const storeDir = `${pool.dir}/store`;
  await Deno.mkdir(storeDir);
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: `${pool.dir}/plugin-bytes`,
    extraArgs: ["--store", `file://${storeDir}`],
    scope: { extraDirs: [storeDir] },
  });
  const changedMiB = Math.max(1, Math.floor(dataMiB / 8));
  const costs = await measureStreamCosts({
    plugin,
    storeDir,
    name: "bytes",
    parameters: { compression },
    dataMiB,
    changedMiB,
  });
  await plugin.stop();
  const zfs = openzfs ? "OpenZFS" : "zfs-fuse";
  const row = (what: string, c: StreamCost): Row => {
    const form = c.manifest.form;
    const flags = form ? formFlags(form) : "";
    return {
      section,
      what,
      plugin: mib(c.stored),
      base: mib(c.used),
      ratio: ratio(c.stored, c.used),
      // The bound is for compressed streams; zfs-fuse's stay plain, as before.
      ...(form?.compressed ? { target: TARGET } : {}),
      note: `${zfs}: stored as zfs send ${flags || "(plain)"}; before (plain zfs send of the ` +
        `same snapshots) ${mib(c.plain)}, ${(c.plain / c.used).toFixed(2)}x used; stream ` +
        `features ${form?.features?.join(",") || "none"}`,
    };
  };
  return [
    row(
      `stored bytes of ${dataMiB} MiB of text, compression=${compression}, full vs its used`,
      costs.full,
    ),
    row(
      `stored bytes of the increment of a move (${changedMiB} MiB rewritten) vs the space it took`,
      costs.increment,
    ),
  ];
}
