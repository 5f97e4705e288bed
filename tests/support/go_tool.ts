/**
 * Go programs the tests run (versitygw, Prometheus), built once per machine from the Go module
 * proxy into ${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/<name>-<version>/, like csi-sanity and Nomad
 * (tests/conformance/csi_sanity.sh, tests/e2e/nomad_install.sh). Concurrent test processes wait
 * on a lock file for one build; a build lands by rename, so others see no binary or a whole one.
 * Without Go the tests fail and say so.
 */

/** One Go tool to build. */
export interface GoTool {
  /** Cache directory name, e.g. "versitygw" (the directory is `<name>-<version>`). */
  readonly name: string;
  /** Module version, e.g. "v1.8.0". */
  readonly version: string;
  /** Main packages to `go install`, e.g. "github.com/versity/versitygw/cmd/versitygw". */
  readonly packages: readonly string[];
  /** What needs it, for the error without Go: "The S3 tests". */
  readonly neededBy: string;
  /**
   * GOTOOLCHAIN for the build (default "local": the Go found must be new enough). "auto" lets
   * an older Go fetch the toolchain the module's go line asks for, from the same proxy.
   */
  readonly toolchain?: string;
  /** Go build tags (`go install -tags`), e.g. to leave out parts the tests do not use. */
  readonly tags?: readonly string[];
}

/** The directory a tool's binaries are cached in. */
export function goToolDir(tool: Pick<GoTool, "name" | "version">): string {
  const cache = Deno.env.get("ZFS_CSI_CACHE") || "/var/cache/zfs-csi";
  return `${cache}/${tool.name}-${tool.version}`;
}

/** Whether `path` exists. */
export async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/**
 * A Go of at least 1.25, as tools/go.sh finds it (PATH, /usr/local/go/bin, the cache) or
 * bootstraps it from the Go module proxy; undefined when it cannot (its stderr says why).
 */
export async function findGo(): Promise<string | undefined> {
  const script = new URL("../../tools/go.sh", import.meta.url).pathname;
  const out = await new Deno.Command("bash", { args: [script], stdout: "piped", stderr: "inherit" })
    .output();
  const path = new TextDecoder().decode(out.stdout).trim();
  return out.success && path !== "" ? path : undefined;
}

/** The program name of a main package: its last path element. */
function binaryName(pkg: string): string {
  return pkg.slice(pkg.lastIndexOf("/") + 1);
}

/**
 * The tool's binaries by program name, built first if the cache lacks any of them.
 * @throws {Error} when Go is missing or the build fails
 */
export async function goToolBinaries(tool: GoTool): Promise<Record<string, string>> {
  const dir = goToolDir(tool);
  const names = tool.packages.map(binaryName);
  const bins = Object.fromEntries(names.map((n) => [n, `${dir}/${n}`]));
  const all = async () => (await Promise.all(names.map((n) => exists(bins[n]!)))).every((e) => e);
  if (await all()) return bins;
  await Deno.mkdir(dir, { recursive: true });
  using lock = await Deno.open(`${dir}/.build.lock`, { create: true, write: true });
  await lock.lock(true);
  if (await all()) return bins;
  const go = await findGo();
  if (go === undefined) {
    throw new Error(
      `${tool.neededBy} need ${tool.name} ${tool.version}, built from the Go module proxy, and ` +
        `Go (1.25+) is needed to build it: tools/go.sh found none and could not fetch one (its ` +
        `message is above). Install Go, or ` +
        `put built binaries (${names.join(", ")}) in ${dir}`,
    );
  }
  const build = await Deno.makeTempDir({ dir, prefix: "build." });
  try {
    const out = await new Deno.Command(go, {
      args: [
        "install",
        ...(tool.tags?.length ? ["-tags", tool.tags.join(",")] : []),
        ...tool.packages.map((p) => `${p}@${tool.version}`),
      ],
      // Outside any module, so only the tool's own go.mod counts.
      cwd: build,
      env: { GOBIN: build, GOTOOLCHAIN: tool.toolchain ?? "local", GOFLAGS: "-buildvcs=false" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      throw new Error(
        `Building ${tool.name} ${tool.version} with ${go} failed:\n` +
          new TextDecoder().decode(out.stderr).slice(-4000),
      );
    }
    // A rename in one directory: other processes see no binary or a whole one.
    for (const n of names) await Deno.rename(`${build}/${n}`, bins[n]!);
  } finally {
    await Deno.remove(build, { recursive: true }).catch(() => {});
  }
  return bins;
}

/** A port that was free a moment ago on 127.0.0.1. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close();
  return port;
}

/** Keeps the last 8000 characters a child wrote, for error messages. */
export async function tail(
  stream: ReadableStream<Uint8Array>,
  into: { text: string },
): Promise<void> {
  const decoder = new TextDecoder();
  for await (const chunk of stream) {
    into.text = (into.text + decoder.decode(chunk, { stream: true })).slice(-8000);
  }
}
