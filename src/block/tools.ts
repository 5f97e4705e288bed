/**
 * The block tools on a node, behind the one subprocess seam (src/run.ts): what blkid finds on a
 * zvol's device, and wipefs, mkfs and the filesystem grow, each failing with a CsiError that
 * says what failed.
 */

import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { CommandRunner } from "../run.ts";
import type { ZvolFsType } from "../volume/zvol.ts";
import {
  BLOCK_PROGRAM_NAMES,
  type BlockProgramName,
  defaultProgram,
  PROCESS_LOOKUP,
  ZVOL_ID_PROGRAMS,
} from "../permissions.ts";
import {
  blkidArgs,
  type BlockDevice,
  growArgs,
  lsblkArgs,
  mkfsArgs,
  parseBlkid,
  parseLsblk,
  type Signature,
  wipefsArgs,
  zvolIdArgs,
} from "./args.ts";

/** mkfs and a grow may take longer than one zfs command: at least this long. */
const SLOW_TOOL_MS = 10 * 60_000;

/** blkid, wipefs, mkfs and grow on zvol devices. */
export class BlockTools {
  readonly #runner: CommandRunner;
  readonly #timeoutMs: number;
  readonly #log: Logger;
  /** Each tool's program: its name on PATH, or without PATH the file found (permissions.ts). */
  readonly #program: (name: BlockProgramName | "zvol_id") => string;
  /** Each program's path, found at its first use: a plugin without zvols never looks. */
  readonly #programs = new Map<string, string>();

  constructor(
    runner: CommandRunner,
    opts: {
      readonly timeoutMs: number;
      readonly log: Logger;
      readonly program?: (name: BlockProgramName | "zvol_id") => string;
    },
  ) {
    this.#runner = runner;
    this.#timeoutMs = opts.timeoutMs;
    this.#log = opts.log;
    const program = opts.program ??
      ((name: BlockProgramName | "zvol_id") =>
        name === "zvol_id"
          ? ZVOL_ID_PROGRAMS.find((f) => PROCESS_LOOKUP.exists(f)) ?? ZVOL_ID_PROGRAMS[0]
          : defaultProgram(name));
    this.#program = program;
  }

  /** `argv` with its program as this node runs it. */
  #argv(argv: readonly string[]): string[] {
    const name = argv[0]!;
    if (!this.#programs.has(name) && isProgramName(name)) {
      this.#programs.set(name, this.#program(name));
    }
    return [this.#programs.get(name) ?? name, ...argv.slice(1)];
  }

  /**
   * The block device `link` leads to, or undefined when it leads to none (missing, or not a
   * block device: lsblk exits 32 for both).
   */
  async blockDevice(link: string): Promise<BlockDevice | undefined> {
    const argv = this.#argv(lsblkArgs(link));
    const res = await this.#runner.run(argv, { timeoutMs: this.#timeoutMs });
    if (!res.timedOut && res.code === 32) return undefined;
    if (res.timedOut || res.code !== 0) throw this.#failed(argv, res);
    return parseLsblk(res.stdout);
  }

  /** The dataset the zvol `device` is, as the kernel says (zvol_id). */
  async datasetOf(device: string): Promise<string> {
    const argv = this.#argv(zvolIdArgs(device));
    const res = await this.#runner.run(argv, { timeoutMs: this.#timeoutMs });
    if (res.timedOut || res.code !== 0) throw this.#failed(argv, res);
    return res.stdout.trim();
  }

  /** The signature on `device`, or undefined when it has none. */
  async signature(device: string): Promise<Signature | undefined> {
    const argv = this.#argv(blkidArgs(device));
    const res = await this.#runner.run(argv, { timeoutMs: this.#timeoutMs });
    if (res.timedOut || (res.code !== 0 && res.code !== 2)) throw this.#failed(argv, res);
    return parseBlkid(res.stdout, res.code);
  }

  /** Erases every signature on `device`. */
  async wipe(device: string): Promise<void> {
    await this.#run(wipefsArgs(device), this.#timeoutMs);
  }

  /** Makes a `fsType` filesystem on `device`. */
  async mkfs(fsType: ZvolFsType, device: string): Promise<void> {
    await this.#run(mkfsArgs(fsType, device), Math.max(this.#timeoutMs, SLOW_TOOL_MS));
  }

  /** Grows the filesystem on `device`, mounted at `mountPoint`, to the device's size. */
  async grow(fsType: ZvolFsType, device: string, mountPoint: string): Promise<void> {
    await this.#run(growArgs(fsType, device, mountPoint), Math.max(this.#timeoutMs, SLOW_TOOL_MS));
  }

  async #run(built: readonly string[], timeoutMs: number): Promise<void> {
    const argv = this.#argv(built);
    this.#log.debug("exec", { argv });
    const res = await this.#runner.run(argv, { timeoutMs });
    if (res.timedOut || res.code !== 0) throw this.#failed(argv, res);
  }

  #failed(
    argv: readonly string[],
    res: { code: number; stderr: string; timedOut: boolean },
  ): CsiError {
    const said = res.timedOut
      ? "timed out"
      : (res.stderr.trim().split("\n")[0] ?? "").slice(0, 300) || `exit code ${res.code}`;
    return new CsiError(Code.INTERNAL, `${argv[0]} failed on ${argv.at(-1)}: ${said}`);
  }
}

/** Whether `name` is one of the programs a BlockTools runs. */
function isProgramName(name: string): name is BlockProgramName | "zvol_id" {
  return name === "zvol_id" || (BLOCK_PROGRAM_NAMES as readonly string[]).includes(name);
}
