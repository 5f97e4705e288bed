/**
 * Where does the plugin's RSS growth come from? Each candidate runs alone in its own process,
 * under the plugin's V8 flags (or others given with --v8), and reports its RSS and live heap
 * (after a forced GC) as it goes:
 *
 *   spawn      the plugin's own runner (src/run.ts) starting `true`, stdout/stderr piped
 *   spawn-piped Deno.Command starting `true` with stdout and stderr piped, nothing else
 *   spawn-null Deno.Command starting `true` with nothing piped: spawning and nothing else
 *   log        the plugin's JSON logger writing info lines (stderr to /dev/null)
 *   grpc       a grpc-js server with the real unary wrapper answering Probe on one connection
 *   grpc-churn the same, with a new client connection every 50 calls (as Nomad's controller)
 *   idle       nothing: the baseline of a loaded module graph
 *
 *   deno run --allow-all bench/rss_isolate.ts [--cases spawn,log] [--n 4000] [--deno PATH]
 *     [--v8 --max-semi-space-size=1,--max-old-space-size=128]
 * (--deno runs the candidates under another Deno, e.g. a newer release.)
 */

import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { V8_FLAGS } from "../src/permissions.ts";
import { CsiClient } from "../tests/support/csi_client.ts";

const SELF = fileURLToPath(import.meta.url);
const CASES = ["spawn", "spawn-piped", "spawn-null", "log", "grpc", "grpc-churn", "idle"] as const;
type Case = typeof CASES[number];
const SAMPLES = 8;

/** One sample a candidate reports: iterations done, RSS and live heap in bytes. */
interface Sample {
  readonly n: number;
  readonly rss: number;
  readonly heap: number;
  /** Bytes V8 holds for its heap (live or not), after the GC. */
  readonly heapTotal: number;
}

const encoder = new TextEncoder();
function out(line: string): void {
  Deno.stdout.writeSync(encoder.encode(line + "\n"));
}

function sample(n: number): Sample {
  (globalThis as { gc?: () => void }).gc?.();
  const m = Deno.memoryUsage();
  return { n, rss: m.rss, heap: m.heapUsed, heapTotal: m.heapTotal };
}

/** The candidate side: runs `which` `n` times and prints a JSON sample every n/SAMPLES. */
async function child(which: Case, n: number, socket: string): Promise<void> {
  const every = Math.max(1, Math.floor(n / SAMPLES));
  const report = (i: number) => out(JSON.stringify(sample(i)));
  report(0);
  if (which === "grpc" || which === "grpc-churn") {
    const grpc = await import("@grpc/grpc-js");
    const { loadCsiServices } = await import("../src/grpc/proto.ts");
    const { unary } = await import("../src/grpc/handler.ts");
    const { Logger } = await import("../src/log.ts");
    const log = new Logger("info");
    let served = 0;
    const server = new grpc.Server();
    server.addService(loadCsiServices().Identity.service, {
      Probe: unary("Probe", () => {
        served++;
        // Reported once the answer is on its way, so the sample is not inside the call.
        if (served % every === 0) setTimeout(() => report(served), 0);
        return Promise.resolve({ ready: { value: true } });
      }, log),
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(
        `unix://${socket}`,
        grpc.ServerCredentials.createInsecure(),
        (err) => err ? reject(err) : resolve(),
      )
    );
    out("serving");
    return; // Served until the driver kills the process.
  }
  if (which === "log") {
    const { Logger } = await import("../src/log.ts");
    const log = new Logger("info", { plugin: "rss-isolate" });
    for (let i = 1; i <= n; i++) {
      log.info("NodeStageVolume", { volumeId: `vol-${i}`, durationMs: 12.3, code: "OK" });
      if (i % every === 0) report(i);
    }
  } else if (which === "spawn") {
    const { DenoCommandRunner } = await import("../src/run.ts");
    const runner = new DenoCommandRunner();
    for (let i = 1; i <= n; i++) {
      await runner.run(["true"]);
      if (i % every === 0) report(i);
    }
  } else if (which === "spawn-piped") {
    for (let i = 1; i <= n; i++) {
      await new Deno.Command("true", { stdin: "null", stdout: "piped", stderr: "piped" }).output();
      if (i % every === 0) report(i);
    }
  } else if (which === "spawn-null") {
    for (let i = 1; i <= n; i++) {
      await new Deno.Command("true", { stdin: "null", stdout: "null", stderr: "null" }).output();
      if (i % every === 0) report(i);
    }
  } else {
    for (let i = 1; i <= SAMPLES; i++) {
      await new Promise((r) => setTimeout(r, 250));
      report(i);
    }
  }
  Deno.exit(0);
}

/** Reads JSON samples from a candidate's stdout until it ends (or prints "serving"). */
async function readSamples(
  reader: ReadableStreamDefaultReader<string>,
  into: Sample[],
  untilServing: boolean,
): Promise<void> {
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    const lines = buf.split("\n");
    buf = lines.pop() ?? "";
    for (const line of lines) {
      if (line === "serving" && untilServing) return;
      if (line.startsWith("{")) into.push(JSON.parse(line) as Sample);
    }
  }
}

/** The driver side: runs one candidate as a child and returns its samples. */
async function drive(which: Case, n: number, deno: string, v8: string): Promise<Sample[]> {
  const dir = await Deno.makeTempDir({ prefix: "rss-isolate-" });
  const socket = `${dir}/s.sock`;
  const proc = new Deno.Command(deno, {
    args: [
      "run",
      "--quiet",
      "--frozen",
      "--allow-all",
      `--v8-flags=${v8 ? `${v8},` : ""}--expose-gc`,
      SELF,
      "--child",
      which,
      "--n",
      String(n),
      "--socket",
      socket,
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const samples: Sample[] = [];
  try {
    if (which === "grpc" || which === "grpc-churn") {
      await readSamples(reader, samples, true);
      const rest = readSamples(reader, samples, false);
      let client = new CsiClient(socket);
      for (let i = 1; i <= n; i++) {
        await client.identity("Probe");
        if (which === "grpc-churn" && i % 50 === 0) {
          client.close();
          client = new CsiClient(socket);
        }
      }
      client.close();
      await new Promise((r) => setTimeout(r, 300));
      proc.kill("SIGKILL");
      await rest;
    } else {
      await readSamples(reader, samples, false);
    }
  } finally {
    try {
      proc.kill("SIGKILL");
    } catch {
      // Already ended.
    }
    await proc.status;
    await Deno.remove(dir, { recursive: true });
  }
  return samples;
}

const mib = (b: number) => (b / 1024 / 1024).toFixed(1);

const { values } = parseArgs({
  args: Deno.args,
  options: {
    child: { type: "string" },
    socket: { type: "string" },
    cases: { type: "string" },
    n: { type: "string" },
    deno: { type: "string" },
    v8: { type: "string" },
  },
});
const n = Number(values.n ?? 4000);
if (!Number.isInteger(n) || n <= 0) throw new RangeError(`--n must be a positive integer`);
if (values.child !== undefined) {
  if (!(CASES as readonly string[]).includes(values.child)) {
    throw new RangeError(`unknown case ${values.child}`);
  }
  await child(values.child as Case, n, values.socket ?? "");
} else {
  const cases = (values.cases ?? CASES.join(",")).split(",") as Case[];
  for (const c of cases) {
    if (!(CASES as readonly string[]).includes(c)) throw new RangeError(`unknown case ${c}`);
  }
  const deno = values.deno ?? Deno.execPath();
  const v8 = values.v8 ?? V8_FLAGS.replace("--v8-flags=", "");
  const version = new TextDecoder().decode(
    (await new Deno.Command(deno, { args: ["--version"], stdout: "piped" }).output()).stdout,
  ).split("\n")[0];
  out(`${version}; V8 flags: ${v8 || "(none)"}; ${n} iterations per case`);
  out(
    "case        | RSS MiB at each eighth                          | live heap first→last | V8 heap total",
  );
  for (const c of cases) {
    const s = await drive(c, n, deno, v8);
    const first = s[0];
    const last = s.at(-1);
    out(
      `${c.padEnd(11)} | ${s.map((x) => mib(x.rss)).join(" ").padEnd(47)} | ` +
        (first && last
          ? `${mib(first.heap)} → ${mib(last.heap)}`.padEnd(20) +
            ` | ${mib(first.heapTotal)} → ${mib(last.heapTotal)}`
          : "no samples"),
    );
  }
}
