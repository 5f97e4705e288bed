/**
 * `zfs-csi backup set VOLUME --interval TIME [--keep POLICY]`: gives a volume its own backup
 * schedule, the properties the scheduler reads (src/replicate/scheduler.ts), after checking it
 * is a volume of zfs-csi's, instead of a hand `zfs set`. `default` returns a setting to the
 * plugin's --backup-interval / --backup-keep; `--interval 0` turns scheduled backups off.
 */

import { ConfigError } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import { FOLLOW_GENERATION_PROPERTY } from "../follow/copy.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../replicate/local.ts";
import { effectiveSchedule, SCHEDULE_PROPS, scheduledType } from "../replicate/scheduler.ts";
import { formatKeepPolicy, parseInterval, parseKeepPolicy } from "../store/policy.ts";
import { ZVOL_CONTENT_PROPERTY } from "../volume/zvol.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE } from "../zfs/names.ts";
import { hasOwnMarker, type PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { type CliIo, printJson } from "./io.ts";
import { intervalText } from "./list.ts";
import {
  buildTools,
  checkPrograms,
  requireParent,
  resolveConfig,
  splitArgs,
  type ToolOptions,
} from "./setup.ts";
import { namedVolume } from "./target.ts";

/** A change `backup set` makes: a value to set, or `default` to inherit the plugin's. */
export type Setting = { readonly set: string } | { readonly inherit: true };

/**
 * Reads `--interval` and `--keep` as the scheduler will.
 * @throws {ConfigError} naming the flag and what is wrong
 */
export function parseSettings(
  interval: string | undefined,
  keep: string | undefined,
): { interval?: Setting; keep?: Setting } {
  if (interval === undefined && keep === undefined) {
    throw new ConfigError("backup set needs --interval TIME (e.g. 1h, 0 for off) or --keep POLICY");
  }
  const read = (flag: string, text: string, parse: (t: string) => string): Setting => {
    if (text === "default") return { inherit: true };
    try {
      return { set: parse(text) };
    } catch (err) {
      throw new ConfigError(`--${flag}: ${err instanceof Error ? err.message : String(err)}`);
    }
  };
  return {
    ...(interval === undefined
      ? {}
      : { interval: read("interval", interval, (t) => String(parseInterval(t))) }),
    ...(keep === undefined
      ? {}
      : { keep: read("keep", keep, (t) => formatKeepPolicy(parseKeepPolicy(t))) }),
  };
}

/**
 * Checks that `dataset` is a volume of zfs-csi's that takes a schedule of its own: a filesystem
 * or a zvol, by the scheduler's rule ({@linkcode scheduledType}), with the plugin's marker.
 * @throws {CsiError} NOT_FOUND; FAILED_PRECONDITION for a dataset that is not zfs-csi's (a zvol
 *   without its own fs-type record), or a volume that follows its job (its interval is its owner
 *   record's)
 */
export async function readVolume(zfs: Zfs, dataset: string): Promise<PropertyMap> {
  const props = await zfs.getProperties(dataset, [...SCHEDULE_PROPS, BACKUP_KEEP_PROPERTY]);
  if (!props) throw new CsiError(Code.NOT_FOUND, `No volume "${dataset}"`);
  if (scheduledType(props) === undefined) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      props.get("type")?.value === "volume"
        ? `"${dataset}" is a zvol zfs-csi did not make (no ${ZVOL_CONTENT_PROPERTY} of its own)`
        : `"${dataset}" is not a filesystem or a zvol`,
    );
  }
  if (!hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${dataset}" is not zfs-csi's (no ${MANAGED_PROPERTY}=${MANAGED_VALUE} of its own): ` +
        `hand it over with zfs-csi adopt first`,
    );
  }
  if ((props.get(FOLLOW_GENERATION_PROPERTY)?.value ?? "-") !== "-") {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${dataset}" follows its job: its backup interval is its recovery point, kept in the ` +
        `store with the volume, and set when it is created`,
    );
  }
  return props;
}

/** Usage of `backup`. */
export const usage =
  `Usage: zfs-csi backup set --parent-dataset NAME --node-id ID [plugin flags] VOLUME
                          [--interval TIME] [--keep POLICY] [--json]

Gives VOLUME (a volume's name, or a host volume's .host-<namespace>_<name>) its own backup
schedule: --interval as seconds or a duration (15m, 1h, 1d; 0 turns scheduled backups off),
--keep as a keep policy (last=N,hourly=N,daily=N,weekly=N). "default" for either returns it
to the plugin's --backup-interval / --backup-keep. The plugin's next pass (within 30 s) uses it;
backups need the plugin's --store. Volumes without an interval of their own are backed up at
the plugin's --backup-interval (zfs-csi list shows each volume's schedule).`;

/** Runs `backup`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ToolOptions = {},
): Promise<number> {
  const [action, ...rest] = args;
  if (action !== "set") {
    throw new ConfigError(
      action === undefined
        ? "backup takes an action: backup set VOLUME --interval TIME"
        : `backup has no action "${action}": backup set VOLUME --interval TIME`,
    );
  }
  const split = splitArgs(rest, {
    json: { type: "boolean" },
    interval: { type: "string" },
    keep: { type: "string" },
  });
  if (split.positionals.length !== 1) throw new ConfigError("backup set takes one VOLUME");
  const settings = parseSettings(
    typeof split.own.interval === "string" ? split.own.interval : undefined,
    typeof split.own.keep === "string" ? split.own.keep : undefined,
  );
  const config = resolveConfig(split.configArgs);
  if (!opts.runner) checkPrograms([config.zfsPath]);
  const tools = buildTools(config, { level: "warn", ...opts });
  const { zfs } = tools;
  await requireParent(tools);
  const volume = namedVolume(config.parentDataset, split.positionals[0]!);
  const before = await readVolume(zfs, volume.dataset);
  const sets: [string, string][] = [];
  const inherits: string[] = [];
  for (
    const [property, setting] of [
      [BACKUP_INTERVAL_PROPERTY, settings.interval],
      [BACKUP_KEEP_PROPERTY, settings.keep],
    ] as const
  ) {
    if (!setting) continue;
    if ("set" in setting) sets.push([property, setting.set]);
    else inherits.push(property);
  }
  if (sets.length > 0) await zfs.setProperties(volume.dataset, sets);
  for (const property of inherits) await zfs.inherit(volume.dataset, property);
  const after = await readVolume(zfs, volume.dataset);
  const defaultSeconds = config.store?.defaultBackupIntervalSeconds ?? 0;
  const was = effectiveSchedule(before, defaultSeconds);
  const now = effectiveSchedule(after, defaultSeconds);
  const keep = after.get(BACKUP_KEEP_PROPERTY);
  const result = {
    volume: volume.name,
    dataset: volume.dataset,
    intervalSeconds: now.intervalSeconds,
    source: now.source,
    before: { intervalSeconds: was.intervalSeconds, source: was.source },
    keep: keep && keep.value !== "-" ? keep.value : "default",
  };
  if (split.own.json === true) {
    printJson(io, result);
    return 0;
  }
  const say = (s: typeof now) =>
    s.intervalSeconds > 0
      ? `every ${intervalText(s.intervalSeconds)}${s.source === "default" ? " (default)" : ""}`
      : s.source === "none"
      // Not given --backup-interval, this command cannot know the plugin's: name it instead.
      ? "none of its own: the plugin's --backup-interval"
      : "off";
  io.out(
    `Volume "${volume.name}": backups ${say(now)} (was ${say(was)}), keep ${result.keep}.` +
      (config.store ? "" : " The plugin backs it up only with --store."),
  );
  if (now.source === "parameter" && settings.interval && "inherit" in settings.interval) {
    io.out("Its CreateVolume parameter backup_interval applies again.");
  }
  return 0;
}
