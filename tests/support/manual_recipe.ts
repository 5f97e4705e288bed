/**
 * The manual restore recipe of docs/backups.md ("Restore by hand, without the plugin") as a
 * test runs it: the shell block between `<!-- manual-restore:begin -->` and
 * `<!-- manual-restore:end -->`, run by bash with only bash, coreutils, grep, sed and zfs on
 * PATH (tests/integration/store_manual_restore_test.ts, store_stream_form_test.ts).
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { treeHash } from "./tree_hash.ts";
import { sh, tryRun } from "./zfs_pool.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BEGIN = "<!-- manual-restore:begin -->";
const END = "<!-- manual-restore:end -->";
/** The document that shows operators the recipe: the test runs exactly what they read. */
const DOC = "docs/backups.md";
/** The shell block between the markers of {@linkcode DOC}; and where it was. */
export async function recipe(): Promise<{ script: string; from: string }> {
  const text = await Deno.readTextFile(`${ROOT}${DOC}`);
  const begin = text.indexOf(BEGIN);
  const end = text.indexOf(END, begin);
  assert.ok(begin >= 0 && end >= 0, `No ${BEGIN} ... ${END} block in ${DOC}`);
  const lines = text.slice(begin + BEGIN.length, end).split("\n");
  const open = lines.findIndex((l) => l.startsWith("```"));
  const close = lines.findLastIndex((l) => l.startsWith("```"));
  assert.ok(open >= 0 && close > open, `${DOC}: the markers hold no fenced code block`);
  return { script: lines.slice(open + 1, close).join("\n") + "\n", from: DOC };
}

/** The tools the recipe may use: bash, coreutils, grep, sed and zfs (no jq, no python). */
export const TOOLS = [
  "bash",
  "zfs",
  "grep",
  "sed",
  ...[
    "basename",
    "cat",
    "cut",
    "date",
    "dirname",
    "echo",
    "env",
    "false",
    "head",
    "ls",
    "printf",
    "sha256sum",
    "sort",
    "stat",
    "tail",
    "test",
    "[",
    "tr",
    "true",
    "uniq",
    "wc",
  ],
];

/** A directory of links to exactly {@linkcode TOOLS}, to be the recipe's whole PATH. */
export async function toolDir(dir: string): Promise<string> {
  const bin = `${dir}/tools-bin`;
  await Deno.mkdir(bin, { recursive: true });
  const path = (Deno.env.get("PATH") ?? "").split(":").filter((p) => p !== "");
  for (const tool of TOOLS) {
    for (const p of path) {
      try {
        await Deno.stat(`${p}/${tool}`);
      } catch {
        continue;
      }
      await Deno.symlink(`${p}/${tool}`, `${bin}/${tool}`);
      break;
    }
  }
  return bin;
}

/** Runs the recipe with bash, its variables set in the environment. */
export async function runRecipe(
  script: string,
  vars: { STORE_DIR: string; VOLUME: string; SNAPSHOT: string; TARGET: string; PATH: string },
): Promise<{ code: number; output: string }> {
  const file = await Deno.makeTempFile({ prefix: "zfs-csi-restore-", suffix: ".sh" });
  try {
    await Deno.writeTextFile(file, script);
    const out = await new Deno.Command(`${vars.PATH}/bash`, {
      args: [file],
      env: vars,
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const decode = (b: Uint8Array) => new TextDecoder().decode(b);
    return { code: out.code, output: decode(out.stdout) + decode(out.stderr) };
  } finally {
    await Deno.remove(file);
  }
}

/** Mounts a received dataset and hashes its tree. */
export async function mountedHash(dataset: string, mountpoint: string): Promise<string> {
  await sh("zfs", "mount", dataset);
  try {
    return await treeHash(mountpoint);
  } finally {
    await tryRun("zfs", "unmount", dataset);
  }
}
