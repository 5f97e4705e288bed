/**
 * `zfs-csi purge`: destroys now what deletes set aside, instead of after the retention. It is the
 * server's own purge (src/csi/trash.ts) run once with no retention to wait for: the same
 * listing, the same marks required, each item read again and judged right before it goes, kept
 * (and said why) when anything not made by zfs-csi is in it or clones still need it. Only the
 * waiting is skipped, at the operator's word (--yes); without it, it lists what would go.
 * It also removes the scratch datasets of verifies that are gone (scratch.ts: by their mark,
 * never their name), as the plugin's own sweep does.
 */

import { ConfigError } from "../config.ts";
import { Trash } from "../csi/trash.ts";
import { Logger } from "../log.ts";
import { type CliIo, formatTable, humanBytes, isoSeconds, printJson } from "./io.ts";
import {
  type DeletedRow,
  deletedRows,
  deletedTable,
  LIST_PROPERTIES,
  type ListOptions,
  scratchTable,
} from "./list.ts";
import { type KernelClock, removeStaleScratch, scratchRows, SYSTEM_CLOCK } from "./scratch.ts";
import {
  buildTools,
  checkPrograms,
  readParentTree,
  resolveConfig,
  splitArgs,
  type Tools,
} from "./setup.ts";

/** What a purge did with one item set aside. */
export interface PurgeOutcome {
  readonly hidden: string;
  readonly deletedName: string;
  readonly kind: DeletedRow["kind"];
  readonly usedBytes: number;
  readonly purged: boolean;
  /** Why it was kept, as the purge logged it. */
  readonly reason?: string;
}

/** A log line of the purge that names an item, and what it says. */
function reasonsByName(lines: readonly string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of lines) {
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line) as Record<string, unknown>;
    } catch {
      continue;
    }
    const name = rec.name;
    if (typeof name !== "string" || rec.msg === "purged") continue;
    const error = rec.error as { message?: unknown } | undefined;
    const detail = typeof rec.reason === "string"
      ? rec.reason
      : typeof error?.message === "string"
      ? error.message
      : "";
    out.set(name, detail ? `${String(rec.msg)}: ${detail}` : String(rec.msg));
  }
  return out;
}

/**
 * Runs the trash's purge once with no retention and no observation time, and tells, for each
 * item set aside before, whether it went, and if not why.
 */
export async function purgeNow(tools: Tools): Promise<PurgeOutcome[]> {
  const parent = tools.config.parentDataset;
  const before = deletedRows(parent, await readParentTree(tools, 2, LIST_PROPERTIES));
  const lines: string[] = [];
  const trash = new Trash({
    zfs: tools.zfs,
    parentDataset: parent,
    retentionSeconds: 0,
    // The operator asked now: there is no age to trust the clock for.
    minObservationSeconds: 0,
    locks: tools.locks,
    // Every line, debug too: the report says why each item that stayed was kept.
    log: new Logger("debug", { cli: "purge" }, (line) => lines.push(line)),
  });
  await trash.purge();
  const after = new Set(
    deletedRows(parent, await readParentTree(tools, 2, LIST_PROPERTIES)).map((r) => r.hidden),
  );
  const reasons = reasonsByName(lines);
  return before.map((r) => ({
    hidden: r.hidden,
    deletedName: r.deletedName,
    kind: r.kind,
    usedBytes: r.usedBytes,
    purged: !after.has(r.hidden),
    ...(after.has(r.hidden)
      ? { reason: reasons.get(r.hidden) ?? "kept by the purge's checks" }
      : {}),
  }));
}

/** Usage of `purge`. */
export const usage =
  `Usage: zfs-csi purge --parent-dataset NAME --node-id ID [plugin flags] [--yes] [--json]

Destroys now what deletes set aside (zfs-csi list --deleted), instead of after
--deleted-retention. Without --yes it only lists what would go. It is the plugin's own purge:
only what carries org.zfs-csi:managed and org.zfs-csi:deleted-at set locally, each read again
right before it is destroyed, and kept (saying why) when it holds anything zfs-csi did not make
or clones still need it. What it destroys cannot be undeleted. It also removes the scratch
datasets of zfs-csi verify runs that are gone (marked org.zfs-csi:verify; zfs-csi list
--deleted shows them), never one whose verify still runs.`;

/** Runs `purge`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ListOptions = {},
): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" }, yes: { type: "boolean" } });
  if (split.positionals.length > 0) {
    throw new ConfigError(`purge takes no arguments, got "${split.positionals[0]}"`);
  }
  const config = resolveConfig(split.configArgs);
  if (!opts.runner) checkPrograms([config.zfsPath]);
  const tools = buildTools(config, { level: "warn", ...opts });
  const clock: KernelClock = opts.clock ?? SYSTEM_CLOCK;
  const json = split.own.json === true;
  const parent = config.parentDataset;
  if (split.own.yes !== true) {
    const tree = await readParentTree(tools, 2, LIST_PROPERTIES);
    const rows = deletedRows(parent, tree);
    const stale = scratchRows(parent, tree, clock).filter((r) => r.state === "stale");
    if (json) printJson(io, { dryRun: true, setAside: rows, staleScratch: stale });
    else {
      if (rows.length === 0) io.out(`Nothing is set aside below ${parent}.`);
      else for (const line of deletedTable(rows)) io.out(line);
      if (stale.length > 0) {
        io.out("Scratch datasets of zfs-csi verify runs that are gone:");
        for (const line of scratchTable(stale)) io.out(line);
      }
      const n = rows.length + stale.length;
      if (n > 0) {
        io.out(`Run again with --yes to destroy these ${n} now (they cannot be undeleted).`);
      }
    }
    return 0;
  }
  const outcomes = await purgeNow(tools);
  const scratch = await removeStaleScratch(tools.zfs, parent, clock);
  if (json) {
    printJson(io, [
      ...outcomes,
      ...scratch.removed.map((r) => scratchOutcome(r, true)),
      ...scratch.kept.map((k) => ({ ...scratchOutcome(k, false), reason: k.why })),
    ]);
    return 0;
  }
  if (outcomes.length === 0) io.out(`Nothing is set aside below ${parent}.`);
  else {
    const rows = outcomes.map((o) => [
      o.purged ? "purged" : "kept",
      o.kind,
      humanBytes(o.usedBytes),
      o.deletedName,
      o.reason ?? "",
    ]);
    for (const line of formatTable(["RESULT", "KIND", "USED", "NAME", "WHY KEPT"], rows)) {
      io.out(line);
    }
  }
  for (const r of scratch.removed) {
    io.out(`Removed ${r.dataset} (${humanBytes(r.usedBytes)}), ${r.reason}.`);
  }
  for (const k of scratch.kept) io.out(`Kept ${k.dataset}: ${k.why}.`);
  const freed = outcomes.filter((o) => o.purged).reduce((n, o) => n + o.usedBytes, 0) +
    scratch.removed.reduce((n, r) => n + r.usedBytes, 0);
  const done = outcomes.filter((o) => o.purged).length + scratch.removed.length;
  const all = outcomes.length + scratch.removed.length + scratch.kept.length;
  if (all > 0) {
    io.out(
      `Purged ${done} of ${all}, about ${humanBytes(freed)} freed ` +
        `(${isoSeconds(Math.floor(Date.now() / 1000))}).`,
    );
  }
  return 0;
}

/** A scratch dataset in purge's --json outcomes. */
function scratchOutcome(r: { dataset: string; usedBytes: number }, purged: boolean) {
  return {
    hidden: r.dataset,
    deletedName: "",
    kind: "verify-scratch",
    usedBytes: r.usedBytes,
    purged,
  };
}
