/**
 * `zfs-csi takeover <volume>`: the explicit takeover of a volume that follows its job, for an
 * operator who knows its holder is lost (src/follow/takeover.ts). It needs the store only, as
 * the plugin has it; it runs on any machine whose build may reach the store.
 */

import type { CliIo } from "../cli/io.ts";
import { printJson } from "../cli/io.ts";
import { requireGrant, resolveConfig, splitArgs } from "../cli/setup.ts";
import { ConfigError } from "../config.ts";
import { storeGrants } from "../permissions.ts";
import { openStore } from "../store/open.ts";
import { takeover } from "./takeover.ts";

/** Usage of `takeover`. */
export const usage =
  `Usage: zfs-csi takeover --parent-dataset NAME --node-id ID --store URL [plugin flags] VOLUME
                        [--json]

Releases VOLUME, a volume that follows its job, on behalf of the node that holds it, which must
be lost: the next NodeStage on any node takes it over from the store's last copy (at most one
sync interval old) at once, whatever --takeover-after says. What the old holder wrote after that
copy is not the volume's; if it comes back, its copy is set aside there and never published, and
its late uploads are refused. Needs the store only.`;

/** Runs `takeover`. */
export async function run(args: readonly string[], io: CliIo): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" } });
  if (split.positionals.length !== 1) throw new ConfigError("takeover takes one VOLUME name");
  const volume = split.positionals[0]!;
  const config = resolveConfig(split.configArgs);
  if (!config.store) {
    throw new ConfigError("takeover needs the store: give --store as the plugin has it");
  }
  for (const grant of storeGrants(config.store)) requireGrant(grant);
  const outcome = await takeover(openStore(config.store), volume, {
    by: `zfs-csi takeover on node "${config.nodeId}"`,
    nowMs: Date.now(),
  });
  if (split.own.json === true) printJson(io, { volume, ...outcome });
  else io.out(outcome.message);
  return 0;
}
