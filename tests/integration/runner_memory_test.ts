/**
 * The command runner does not make the plugin's RSS climb with every command it starts. With
 * `ChildProcess.output()` each command left about 100 KiB of native buffers that only a full GC
 * freed (src/child_output.ts), so a plugin with a small heap grew by hundreds of MiB. The runner is
 * driven in its own process, under the plugin's V8 flags and without any forced GC, by the
 * isolation bench (bench/rss_isolate.ts, case "spawn").
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { V8_FLAGS } from "../../src/permissions.ts";

const SCRIPT = fileURLToPath(new URL("../../bench/rss_isolate.ts", import.meta.url));
const COMMANDS = 2000;
/** Allowed growth: the allocator's first arenas and the module graph settling (about 15 MiB). */
const LIMIT_MIB = 40;

Deno.test(`RSS grows less than ${LIMIT_MIB} MiB over ${COMMANDS} commands run`, async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--frozen",
      "--allow-run=true",
      "--allow-read",
      "--allow-env",
      V8_FLAGS,
      SCRIPT,
      "--child",
      "spawn",
      "--n",
      String(COMMANDS),
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const samples = text.split("\n").filter((l) => l.startsWith("{")).map((l) =>
    JSON.parse(l) as { n: number; rss: number }
  );
  assert.ok(samples.length >= 5, `too few samples: ${text}`);
  assert.equal(samples.at(-1)!.n, COMMANDS);
  const growthMiB = (samples.at(-1)!.rss - samples[0]!.rss) / 1024 / 1024;
  assert.ok(
    growthMiB < LIMIT_MIB,
    `RSS grew ${growthMiB.toFixed(1)} MiB: ${samples.map((s) => (s.rss / 1048576).toFixed(0))}`,
  );
});
