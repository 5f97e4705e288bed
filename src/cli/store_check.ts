/**
 * `zfs-csi store check`: checks the store the plugin's flags name does what the plugin relies
 * on (src/store/check.ts), with the binary's own permissions, and says what it checked.
 */

import { ConfigError } from "../config.ts";
import { storeGrants } from "../permissions.ts";
import { type CheckReport, type CheckStep, checkStore } from "../store/check.ts";
import { openStore } from "../store/open.ts";
import { type CliIo, printJson } from "./io.ts";
import { EXIT_FAILED } from "./main.ts";
import { requireGrant, resolveConfig, splitArgs } from "./setup.ts";

/** Usage of `store`. */
export const usage =
  `Usage: zfs-csi store check --parent-dataset NAME --node-id ID --store URL [plugin flags]
                           [--json]

Checks that the store does what the plugin relies on, with a probe object of its own
(v1/probe/<node id>-<random>, deleted after): that it answers; for S3, that the bucket exists;
that it lists, writes, reads back and deletes; and that it enforces conditional writes: a
write with If-None-Match: * to an object that exists, and one with If-Match and an etag the
object does not have, must be refused (412), and one with the object's own etag taken. On a
store that does not enforce them, volumes that follow their job are refused (two nodes could
hold one); ordinary backups work all the same. Runs with the binary's permissions, as the
plugin does (the build must reach the store). Prints each check as it finishes; exits 0 when
all passed, 1 otherwise.`;

const MARK: Readonly<Record<CheckStep["status"], string>> = {
  ok: "ok     ",
  failed: "FAILED ",
  skipped: "skipped",
};

/** The report as JSON can carry it (an error as its message). */
function plain(report: CheckReport): unknown {
  const c = report.conditional;
  return {
    ...report,
    conditional: c.kind === "unknown"
      ? { kind: c.kind, error: c.error instanceof Error ? c.error.message : String(c.error) }
      : c,
  };
}

/** Runs `store check`. */
export async function run(args: readonly string[], io: CliIo): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" } });
  if (split.positionals.length !== 1 || split.positionals[0] !== "check") {
    throw new ConfigError(`store takes one action: check (zfs-csi help store)`);
  }
  const config = resolveConfig(split.configArgs);
  if (!config.store) {
    throw new ConfigError("store check needs the store: give --store as the plugin has it");
  }
  for (const grant of storeGrants(config.store)) requireGrant(grant);
  const store = openStore(config.store);
  const json = split.own.json === true;
  if (!json) io.out(`Checking ${store.description}:`);
  const report = await checkStore(store, {
    node: config.nodeId,
    bucket: config.store.kind === "s3",
    ...(json ? {} : { onStep: (s) => io.out(`  ${MARK[s.status]}  ${s.name}: ${s.detail}`) }),
  });
  if (json) {
    printJson(io, plain(report));
  } else if (report.ok) {
    io.out("Every check passed: the store does what the plugin relies on.");
  } else {
    const failed = report.steps.filter((s) => s.status === "failed").length;
    io.out(
      `${failed} check(s) failed` +
        (report.conditional.kind === "not_enforced"
          ? ": volumes that follow their job are refused on this store (ordinary backups work)."
          : "."),
    );
  }
  return report.ok ? 0 : EXIT_FAILED;
}
