/**
 * Counting shims on disk: a directory of bash scripts named zfs, zpool, mount and umount that
 * log each run (see commands.ts) and run the real program. A plugin started with this
 * directory first on PATH resolves its four programs to them (--allow-run resolves through PATH).
 */

import {
  isBackground,
  type LoggedCommand,
  parseCommandLog,
  PROGRAMS,
  shimScript,
} from "./commands.ts";

/** The absolute path of `program` on PATH. */
export async function which(program: string): Promise<string> {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    if (!dir) continue;
    try {
      const info = await Deno.stat(`${dir}/${program}`);
      if (info.isFile && (info.mode ?? 0) & 0o111) return `${dir}/${program}`;
    } catch {
      // Not here.
    }
  }
  throw new Error(`${program} is not on PATH`);
}

/** The real path of each program the plugin runs. */
export async function realPrograms(): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const p of PROGRAMS) out[p] = await which(p);
  return out;
}

/** A shim directory and its log. */
export class Shims {
  readonly binDir: string;
  readonly logPath: string;
  readonly #parent: string;

  private constructor(dir: string, parentDataset: string) {
    this.binDir = `${dir}/bin`;
    this.logPath = `${dir}/commands.log`;
    this.#parent = parentDataset;
  }

  /** Writes the shims below `dir`; `parentDataset` tells background commands apart. */
  static async create(dir: string, parentDataset: string): Promise<Shims> {
    const s = new Shims(dir, parentDataset);
    const real = await realPrograms();
    await Deno.mkdir(s.binDir, { recursive: true });
    await Deno.writeTextFile(s.logPath, "");
    for (const p of PROGRAMS) {
      await Deno.writeTextFile(`${s.binDir}/${p}`, shimScript(p, real[p]!, s.logPath), {
        mode: 0o755,
      });
    }
    return s;
  }

  /** The shims' paths, one per program. */
  programs(): string[] {
    return PROGRAMS.map((p) => `${this.binDir}/${p}`);
  }

  /** Every command logged so far. */
  async all(): Promise<LoggedCommand[]> {
    return parseCommandLog(await Deno.readTextFile(this.logPath));
  }

  /**
   * Runs `fn` and returns the commands the plugin ran meanwhile, and whether background work
   * (health check, purge) ran in the same window, which makes the attribution unsure.
   */
  async during(fn: () => Promise<unknown>): Promise<{ commands: LoggedCommand[]; mixed: boolean }> {
    const before = (await this.all()).length;
    await fn();
    const window = (await this.all()).slice(before);
    const commands = window.filter((c) => !isBackground(c.argv, this.#parent));
    return { commands, mixed: commands.length !== window.length };
  }
}
