/**
 * Bench-only: preloaded into the plugin (`deno run --preload bench/heap_probe.ts main.ts ...`),
 * so the soak can read the plugin's live heap without the shipped binary exposing anything. On
 * SIGUSR1 it forces a full GC and writes the heap figures, as JSON, to `heap.json` beside the
 * plugin's socket (a directory the plugin may write). main.ts runs unchanged after it, under the
 * same permission flags.
 *
 * The GC is exposed at run time (node:v8 setFlagsFromString), not with --expose-gc, so the V8
 * flags stay exactly those of the binary.
 */

import v8 from "node:v8";
import vm from "node:vm";
import { type HeapReport, heapReportPath } from "./soak_stats.ts";

function endpointArg(args: readonly string[]): string | undefined {
  const i = args.indexOf("--endpoint");
  return i >= 0 ? args[i + 1] : args.find((a) => a.startsWith("--endpoint="))?.slice(11);
}

const endpoint = endpointArg(Deno.args);
if (endpoint !== undefined) {
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc") as () => void;
  const path = heapReportPath(endpoint);
  let seq = 0;
  Deno.addSignalListener("SIGUSR1", () => {
    gc();
    const m = Deno.memoryUsage();
    const report: HeapReport = {
      seq: ++seq,
      heapUsed: m.heapUsed,
      heapTotal: m.heapTotal,
      external: m.external,
      rss: m.rss,
    };
    // Written whole, then renamed: a reader never sees half a report.
    Deno.writeTextFileSync(`${path}.tmp`, JSON.stringify(report));
    Deno.renameSync(`${path}.tmp`, path);
  });
}
