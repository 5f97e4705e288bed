/**
 * The README's flags table and operator commands table are what an operator reads instead of
 * `zfs-csi --help` and `zfs-csi help`: each must name exactly the flags src/config.ts parses and
 * the subcommands src/cli/commands.ts runs, with the defaults the code has, so that a flag or a
 * subcommand added, renamed or removed cannot leave the README behind (both had drifted once).
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  CONFIG_OPTIONS,
  DEFAULT_DELETED_RETENTION,
  DEFAULT_ENDPOINT,
  DEFAULT_MODE,
  DEFAULT_STAGE_PUBLISH_DIR,
  USAGE,
} from "../src/config.ts";
import {
  DEFAULT_BACKUP_KEEP,
  DEFAULT_STORE_DELETED_RETENTION,
  DEFAULT_STORE_REGION,
  DEFAULT_STORE_WAIT,
} from "../src/config_store.ts";
import { SUBCOMMANDS } from "../src/cli/commands.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** One row of a Markdown table: its cells, trimmed. */
type Row = readonly string[];

/**
 * The rows of the first table below the heading `## <title>` (before the next `## `), without
 * its header and separator.
 * @throws {AssertionError} when there is no such section or table
 */
export function tableOf(markdown: string, title: string): Row[] {
  const lines = markdown.split("\n");
  const start = lines.indexOf(`## ${title}`);
  assert.ok(start >= 0, `no "## ${title}" section`);
  const rows: Row[] = [];
  for (const line of lines.slice(start + 1)) {
    if (line.startsWith("## ")) break;
    if (!line.startsWith("|")) {
      if (rows.length > 0) break;
      continue;
    }
    rows.push(line.slice(1, line.lastIndexOf("|")).split("|").map((c) => c.trim()));
  }
  assert.ok(rows.length > 2, `no table in "## ${title}"`);
  assert.match(
    rows[1]!.join(""),
    /^[-: ]+$/,
    `"## ${title}": the table's second line is no separator`,
  );
  return rows.slice(2);
}

/** The flags a cell names: `--store-region`, `--store-path-style` gives both. */
export function flagsIn(cell: string): string[] {
  return [...cell.matchAll(/`(--[a-z][a-z0-9-]*)[^`]*`/g)].map((m) => m[1]!);
}

/** The subcommand a cell names: `zfs-csi backup set VOLUME` gives "backup set". */
export function subcommandIn(cell: string): string | undefined {
  return /^`zfs-csi ([a-z]+(?: [a-z]+)?)/.exec(cell)?.[1];
}

function sorted(items: Iterable<string>): string[] {
  return [...items].sort();
}

async function readme(): Promise<string> {
  return await Deno.readTextFile(join(ROOT, "README.md"));
}

Deno.test("the table readers take what the README's tables write", () => {
  const md = [
    "## Flags",
    "",
    "| flag | default | meaning |",
    "| --- | --- | --- |",
    "| `--store-region`, `--store-path-style` | `us-east-1`, off | region |",
    "| `--store-wait TIME` | `30s` | budget |",
    "",
    "## Operator commands",
    "",
  ].join("\n");
  const rows = tableOf(md, "Flags");
  assert.deepEqual(rows.map((r) => r[0]), [
    "`--store-region`, `--store-path-style`",
    "`--store-wait TIME`",
  ]);
  assert.deepEqual(flagsIn(rows[0]![0]!), ["--store-region", "--store-path-style"]);
  assert.deepEqual(flagsIn(rows[1]![0]!), ["--store-wait"]);
  assert.equal(subcommandIn("`zfs-csi backup set VOLUME --interval TIME`"), "backup set");
  assert.equal(subcommandIn("`zfs-csi list`"), "list");
  assert.equal(subcommandIn("`zfs-csi takeover VOLUME`"), "takeover");
  assert.equal(subcommandIn("`zfs-csi restore VOLUME[@SNAPSHOT] --to NAME`"), "restore");
  assert.throws(() => tableOf(md, "Operator commands"), /no table/);
});

Deno.test("the README's flags table names every flag of zfs-csi --help, and no other", async () => {
  const rows = tableOf(await readme(), "Flags");
  const inTable = rows.flatMap((r) => flagsIn(r[0] ?? ""));
  const parsed = Object.keys(CONFIG_OPTIONS).map((name) => `--${name}`);
  assert.deepEqual(
    sorted(inTable),
    sorted(new Set(inTable)),
    "a flag appears in two rows of the README's flags table",
  );
  assert.deepEqual(sorted(inTable), sorted(parsed), "README.md, ## Flags, against src/config.ts");
  const missingFromHelp = parsed.filter((flag) => !USAGE.includes(flag));
  assert.deepEqual(missingFromHelp, [], "flags src/config.ts parses but zfs-csi --help omits");
});

Deno.test("the README's flags table gives the defaults src/config.ts has", async () => {
  const rows = tableOf(await readme(), "Flags");
  const defaults: Record<string, string> = {
    "--mode": DEFAULT_MODE,
    "--deleted-retention": DEFAULT_DELETED_RETENTION,
    "--endpoint": DEFAULT_ENDPOINT,
    "--stage-publish-base-dir": DEFAULT_STAGE_PUBLISH_DIR,
    "--backup-keep": DEFAULT_BACKUP_KEEP,
    "--store-deleted-retention": DEFAULT_STORE_DELETED_RETENTION,
    "--store-region": DEFAULT_STORE_REGION,
    "--store-wait": DEFAULT_STORE_WAIT,
  };
  const wrong: string[] = [];
  for (const [flag, value] of Object.entries(defaults)) {
    const row = rows.find((r) => flagsIn(r[0] ?? "").includes(flag));
    if (!row?.[1]?.includes(`\`${value}\``)) {
      wrong.push(
        `${flag}: the code's default is ${value}, the README says ${row?.[1] ?? "nothing"}`,
      );
    }
  }
  assert.deepEqual(wrong, []);
});

Deno.test("the README's operator commands table names every subcommand, and no other", async () => {
  const rows = tableOf(await readme(), "Operator commands");
  const named = rows.map((r) => subcommandIn(r[0] ?? "") ?? `(no zfs-csi subcommand: ${r[0]})`);
  // A subcommand with an action word (`backup set`, `store check`) is written with it, as the
  // usage its one-line summary in src/cli/commands.ts starts with gives it ("backup set VOLUME
  // ...", "store check: ..."; not "list volumes and ...").
  const expected = Object.entries(SUBCOMMANDS).map(([name, s]) => {
    const action = new RegExp(`^${name} ([a-z]+)(?::| [A-Z])`).exec(s.summary)?.[1];
    return action === undefined ? name : `${name} ${action}`;
  });
  const bare = named.map((n) => (expected.includes(n) ? n : n.split(" ")[0]!));
  assert.deepEqual(sorted(bare), sorted(expected), "README.md, ## Operator commands");
});
