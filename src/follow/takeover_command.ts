/**
 * `zfs-csi takeover <volume>`: the explicit takeover of a volume that follows its job, for an
 * operator who knows its holder is lost (src/follow/takeover.ts). A dry run by default: it
 * watches the lease and says who holds it, how fresh the lease is, how old the store's copy is
 * and what would be lost; it acts only with --yes, and takes a fresh lease (or a volume the
 * store holds no copy of) only with --force as well. It needs the store only, as the plugin
 * has it; it runs on any machine whose build may reach the store.
 */

import type { CliIo } from "../cli/io.ts";
import { printJson } from "../cli/io.ts";
import { requireGrant, resolveConfig, splitArgs } from "../cli/setup.ts";
import { ConfigError } from "../config.ts";
import { storeGrants } from "../permissions.ts";
import { openStore } from "../store/open.ts";
import { ageText } from "./rule.ts";
import { planLines, planTakeover, refusalText, takeover, type WatchOptions } from "./takeover.ts";

/** Usage of `takeover`. */
export const usage =
  `Usage: zfs-csi takeover --parent-dataset NAME --node-id ID --store URL [plugin flags] VOLUME
                        [--yes] [--force] [--watch SECONDS] [--json]

Takes VOLUME, a volume that follows its job, from the node that holds it, which must be lost:
the next NodeStage on any node then takes it over from the store's last copy at once, whatever
--takeover-after says. What the old holder wrote after that copy is lost to the volume; if the
holder comes back, its copy is set aside there, never published, and its late uploads are
refused.

Without --yes it changes nothing: it watches the lease from this node (default the lease's TTL
plus 1 s, at most 15 s, at least the TTL/3 a live holder renews within; --watch SECONDS) and
shows the holder, when it renewed (by its own clock) against its TTL, how old the store's copy
is, and what would be lost. With --yes it takes the volume, with a write that fails if the lease
changed since it was watched. A fresh lease (it changed while watched, or the holder's stamp is
younger than its TTL by this node's clock), a watch shorter than the holder's renewal period, a
volume held by this node (--node-id), or one the store holds no copy of, is refused unless
--force is given too. Needs the store only.`;

/** Runs `takeover`; `watch` replaces its clocks and sleep in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  watch: Pick<WatchOptions, "now" | "monotonic" | "sleep"> = {},
): Promise<number> {
  const split = splitArgs(args, {
    json: { type: "boolean" },
    yes: { type: "boolean" },
    force: { type: "boolean" },
    watch: { type: "string" },
  });
  if (split.positionals.length !== 1) throw new ConfigError("takeover takes one VOLUME name");
  const volume = split.positionals[0]!;
  const watchText = split.own.watch;
  let watchMs: number | undefined;
  if (typeof watchText === "string") {
    if (!/^\d{1,4}$/.test(watchText)) {
      throw new ConfigError(`--watch "${watchText}" must be whole seconds, e.g. 10`);
    }
    watchMs = Number(watchText) * 1000;
  }
  const config = resolveConfig(split.configArgs);
  if (!config.store) {
    throw new ConfigError("takeover needs the store: give --store as the plugin has it");
  }
  for (const grant of storeGrants(config.store)) requireGrant(grant);
  const store = openStore(config.store);
  const json = split.own.json === true;
  const plan = await planTakeover(store, volume, {
    ...watch,
    node: config.nodeId,
    ...(watchMs === undefined ? {} : { watchMs }),
    onWatch: (ms) => {
      if (!json && ms > 0) io.err(`takeover: watching the lease of "${volume}" for ${ageText(ms)}`);
    },
  });
  const act = split.own.yes === true;
  const force = split.own.force === true;
  if (!act) {
    if (json) {
      printJson(io, { volume, dryRun: true, ...planJson(plan) });
      return 0;
    }
    for (const line of planLines(plan)) io.out(line);
    if (plan.seen.record.state !== "held") {
      io.out("Nothing to take over: the next stage on any node takes it.");
      return 0;
    }
    if (plan.refusals.length > 0) {
      io.out(
        `Would be refused without --force: ${
          plan.refusals.map((r) => refusalText(plan, r)).join("; ")
        }.`,
      );
    }
    io.out(
      `Dry run: nothing was changed. To take it: zfs-csi takeover ... ${volume} --yes` +
        (plan.refusals.length > 0 ? " --force" : ""),
    );
    return 0;
  }
  if (!json) { for (const line of planLines(plan)) io.out(line); }
  const outcome = await takeover(store, plan, {
    by: `zfs-csi takeover on node "${config.nodeId}"`,
    nowMs: Date.now(),
    force,
  });
  if (json) {
    printJson(io, { volume, dryRun: false, changed: outcome.changed, message: outcome.message });
  } else io.out(outcome.message);
  return 0;
}

/** The plan for --json. */
function planJson(plan: Awaited<ReturnType<typeof planTakeover>>) {
  const r = plan.seen.record;
  return {
    state: r.state,
    holder: r.holder,
    generation: r.generation,
    renewedAt: r.renewedAt,
    ttlSeconds: r.ttlSeconds,
    head: r.head,
    headAt: r.headAt,
    watchedSeconds: Math.round(plan.watchedMs / 100) / 10,
    changedWhileWatched: plan.changed,
    stampAgeSeconds: Math.round(plan.stampAgeMs / 1000),
    ...(plan.headAgeMs === undefined ? {} : { headAgeSeconds: Math.round(plan.headAgeMs / 1000) }),
    refusals: plan.refusals,
  };
}
