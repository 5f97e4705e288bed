/**
 * What the unit tests of the CSI services build a service on: a run config for node "n1" in
 * zone "eu1", a debug logger whose lines are kept, a {@linkcode FakeRunner} with the test's fake
 * host behind it, the Zfs and Mounter on that runner, the locks and the health checker.
 */

import { type Config, parseConfig } from "../../src/config.ts";
import { type ControllerDeps, ControllerService } from "../../src/csi/controller.ts";
import { Datasets } from "../../src/volume/datasets.ts";
import { HealthChecker } from "../../src/csi/health.ts";
import { type NodeDeps, NodeService } from "../../src/csi/node.ts";
import { Trash } from "../../src/volume/trash.ts";
import type { VolumeCapability } from "../../src/csi/types.ts";
import { KeyedLock } from "../../src/lock.ts";
import { Logger } from "../../src/log.ts";
import type { Mounter } from "../../src/mount/mounter.ts";
import type { Zfs } from "../../src/zfs/zfs.ts";
import { FakeRunner, fakeTools } from "./fake_runner.ts";

/** The parts a service under test is made of, on a fake host `H`. */
export interface FakeServices<H> {
  readonly config: Config;
  readonly runner: FakeRunner;
  readonly host: H;
  readonly zfs: Zfs;
  readonly mounter: Mounter;
  readonly log: Logger;
  /** Every line logged, oldest first. */
  readonly logs: string[];
  readonly locks: KeyedLock;
  readonly health: HealthChecker;
}

/**
 * Builds the parts of a service for node "n1" in zone "eu1" below `parent`, with `flags` added
 * to the command line. `host` puts the fake host on the runner; `before` scripts the runner
 * first, so its rules win over the host's (it may call `host()` only once a command runs).
 */
export function fakeServices<H>(opts: {
  parent: string;
  flags?: readonly string[];
  host: (runner: FakeRunner) => H;
  before?: (runner: FakeRunner, host: () => H) => void;
}): FakeServices<H> {
  const parsed = parseConfig(
    [
      "--parent-dataset",
      opts.parent,
      "--node-id",
      "n1",
      "--topology",
      "zone=eu1",
      ...opts.flags ?? [],
    ],
    {},
  );
  if (parsed.kind !== "run") throw new Error("parseConfig did not return a run config");
  const logs: string[] = [];
  const log = new Logger("debug", {}, (line) => logs.push(line));
  const runner = new FakeRunner();
  // The closure reads `host` only when a command runs, after it is set below.
  opts.before?.(runner, () => host);
  const host = opts.host(runner);
  const { zfs, mounter } = fakeTools(runner, log);
  const health = new HealthChecker({ zfs, mounter, parentDataset: opts.parent, log });
  return {
    config: parsed.config,
    runner,
    host,
    zfs,
    mounter,
    log,
    logs,
    locks: new KeyedLock(),
    health,
  };
}

/** A NodeService on `parts` (Datasets on its zfs and mount), with the optional deps in `extra`. */
export function fakeNode<H>(
  parts: FakeServices<H>,
  extra: Pick<NodeDeps, "statfs" | "follow" | "blockTools" | "deviceProbe"> = {},
): NodeService {
  const { config, zfs, mounter, health, locks, log } = parts;
  return new NodeService({
    config,
    zfs,
    mounter,
    datasets: new Datasets(zfs, mounter),
    health,
    locks,
    log,
    ...extra,
  });
}

/** A trash on `parts` below the config's parent that keeps nothing (retention 0). */
export function fakeTrash<H>(parts: FakeServices<H>): Trash {
  const { config, zfs, locks, log } = parts;
  return new Trash({ zfs, parentDataset: config.parentDataset, retentionSeconds: 0, locks, log });
}

/** A ControllerService on `parts` and `trash`, with the optional deps in `extra`. */
export function fakeController<H>(
  parts: FakeServices<H>,
  extra: Pick<ControllerDeps, "stored" | "scheduler" | "follow"> = {},
  trash: Trash = fakeTrash(parts),
): ControllerService {
  const { config, zfs, mounter, health, locks, log } = parts;
  return new ControllerService({ config, zfs, mounter, health, locks, trash, log, ...extra });
}

/** A filesystem capability as a CSI request carries it. */
export function fsCap(mode = "SINGLE_NODE_WRITER", flags: string[] = []): VolumeCapability {
  return {
    mount: { fs_type: "", mount_flags: flags, volume_mount_group: "" },
    access_mode: { mode },
    access_type: "mount",
  };
}

/** A block capability, which the plugin refuses. */
export function blockCap(): VolumeCapability {
  return { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" }, access_type: "block" };
}
