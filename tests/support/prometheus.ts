/**
 * A real Prometheus for tests, pinned below, scraping targets on 127.0.0.1 and answering its
 * HTTP query API on 127.0.0.1; and promtool, to check an exposition as Prometheus's own linter
 * does. Both are built once per machine from the Go module proxy into
 * ${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/prometheus-<version>/ (go_tool.ts), with Nomad's service
 * discovery only. Built without the web UI's assets (they are not Go code; the module has no
 * built ones): the UI's pages answer 500, the query API does not need them.
 */

import { ChildServer, ChildServerHolder } from "./child_server.ts";
import { goToolBinaries } from "./go_tool.ts";

/**
 * The one place Prometheus's version is pinned: the Go module version (Prometheus 3.x is
 * published to the module proxy as v0.3xx.y; its go line asks for Go 1.26.7).
 */
export const PROMETHEUS_VERSION = "v0.316.0";
const MODULE = "github.com/prometheus/prometheus";
const START_MS = 60_000;

/**
 * prometheus and promtool, built first if the cache lacks them (several minutes, once).
 * @throws {Error} when Go is missing or the build fails
 */
export async function prometheusBinaries(): Promise<{ prometheus: string; promtool: string }> {
  const bins = await goToolBinaries({
    name: "prometheus",
    version: PROMETHEUS_VERSION,
    packages: [`${MODULE}/cmd/prometheus`, `${MODULE}/cmd/promtool`],
    neededBy: "The metrics tests",
    // The module asks for a newer Go than the pinned bootstrap may be: let go fetch that one.
    toolchain: "auto",
    // Only the service discovery the tests and nomad/prometheus.yml use (static needs no tag):
    // Prometheus's own build tags leave out Kubernetes, the clouds and the rest, which takes
    // 40 % less CPU and a third of the memory to build (docs/metrics.md, "Tests").
    tags: ["remove_all_sd", "enable_nomad_sd"],
  });
  return { prometheus: bins.prometheus!, promtool: bins.promtool! };
}

/** What `promtool check metrics` said of an exposition. */
export interface PromtoolVerdict {
  readonly success: boolean;
  /** Its stdout and stderr: the problems it found (empty when none). */
  readonly output: string;
}

/** Runs `promtool check config` on a Prometheus configuration file. */
export async function promtoolCheckConfig(path: string): Promise<PromtoolVerdict> {
  const { promtool } = await prometheusBinaries();
  const out = await new Deno.Command(promtool, {
    args: ["check", "config", "--syntax-only", path],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return {
    success: out.success,
    output: (decoder.decode(out.stdout) + decoder.decode(out.stderr)).trim(),
  };
}

/** Runs `promtool check metrics` on `exposition` (the lint Prometheus recommends). */
export async function promtoolCheckMetrics(exposition: string): Promise<PromtoolVerdict> {
  const { promtool } = await prometheusBinaries();
  const child = new Deno.Command(promtool, {
    args: ["check", "metrics"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(exposition));
  await writer.close();
  const out = await child.output();
  const decoder = new TextDecoder();
  return {
    success: out.success,
    output: (decoder.decode(out.stdout) + decoder.decode(out.stderr)).trim(),
  };
}

/** One series of an instant query's answer. */
export interface VectorSample {
  readonly metric: Readonly<Record<string, string>>;
  readonly value: number;
}

/** How Prometheus scrapes. */
export interface PrometheusOptions {
  /** host:port of each target, scraped at /metrics. */
  readonly targets: readonly string[];
  /** Seconds between scrapes (default 1). */
  readonly scrapeIntervalSeconds?: number;
}

/** A running Prometheus on a temporary directory. */
export class PrometheusServer extends ChildServerHolder {
  /** e.g. http://127.0.0.1:40123 */
  readonly url: URL;
  readonly dir: string;

  private constructor(server: ChildServer) {
    super(server);
    this.url = server.url;
    this.dir = server.dir;
  }

  /** Starts Prometheus (building it first if needed) and waits until it is ready. */
  static async start(options: PrometheusOptions): Promise<PrometheusServer> {
    const { prometheus } = await prometheusBinaries();
    const dir = await Deno.makeTempDir({ prefix: "zfs-csi-prometheus-" });
    const interval = options.scrapeIntervalSeconds ?? 1;
    // JSON is YAML: no YAML writer needed.
    const config = {
      global: { scrape_interval: `${interval}s`, scrape_timeout: `${interval}s` },
      scrape_configs: [{
        job_name: "zfs-csi",
        metrics_path: "/metrics",
        static_configs: [{ targets: options.targets }],
      }],
    };
    await Deno.writeTextFile(`${dir}/prometheus.yml`, JSON.stringify(config, null, 2));
    const server = await ChildServer.start({
      name: "Prometheus",
      bin: prometheus,
      dir,
      args: (port) => [
        `--config.file=${dir}/prometheus.yml`,
        `--storage.tsdb.path=${dir}/data`,
        `--web.listen-address=127.0.0.1:${port}`,
        "--log.level=warn",
      ],
      cwd: dir,
      probe: async (url) => {
        const r = await fetch(new URL("/-/ready", url), { signal: AbortSignal.timeout(1000) });
        await r.body?.cancel();
        return r.ok;
      },
      notReady: "was not ready on",
      startMs: START_MS,
      pollMs: 200,
    });
    return new PrometheusServer(server);
  }

  /**
   * An instant query through /api/v1/query; the answer must be a vector.
   * @throws {Error} when Prometheus answers an error or another result type
   */
  async query(expr: string): Promise<VectorSample[]> {
    const url = new URL("/api/v1/query", this.url);
    url.searchParams.set("query", expr);
    const r = await fetch(url, { signal: AbortSignal.timeout(10_000) });
    const body = await r.json() as {
      status: string;
      error?: string;
      data?: {
        resultType: string;
        result: { metric: Record<string, string>; value: [number, string] }[];
      };
    };
    if (body.status !== "success" || body.data?.resultType !== "vector") {
      throw new Error(`Query ${expr} answered ${r.status}: ${JSON.stringify(body)}`);
    }
    return body.data.result.map((s) => ({ metric: s.metric, value: Number(s.value[1]) }));
  }

  /**
   * Queries `expr` until `accept` takes the answer; returns that answer.
   * @throws {Error} with the last answer when `timeoutMs` passes first
   */
  async waitFor(
    expr: string,
    accept: (samples: VectorSample[]) => boolean,
    timeoutMs = 30_000,
  ): Promise<VectorSample[]> {
    const deadline = Date.now() + timeoutMs;
    let last: VectorSample[] = [];
    while (Date.now() < deadline) {
      last = await this.query(expr);
      if (accept(last)) return last;
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(
      `Prometheus's answer to ${expr} was not accepted within ${timeoutMs}ms; last: ` +
        JSON.stringify(last),
    );
  }

  /** The scrape targets' health as Prometheus sees it (/api/v1/targets). */
  async targets(): Promise<{ scrapeUrl: string; health: string; lastError: string }[]> {
    const r = await fetch(new URL("/api/v1/targets", this.url));
    const body = await r.json() as {
      data: { activeTargets: { scrapeUrl: string; health: string; lastError: string }[] };
    };
    return body.data.activeTargets;
  }
}
