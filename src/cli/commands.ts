/**
 * The operator subcommands, by name: adding one is one line here (its module exports `usage`
 * and `run`). Modules load only when their subcommand runs, so `list` never loads grpc-js.
 * `fingerprint`, `create` and `delete` are Nomad's host volume operations (main.ts), never
 * subcommands.
 */

import type { CliIo } from "./io.ts";

/** What a subcommand's module exports. */
export interface SubcommandModule {
  /** Its usage, shown by `zfs-csi help <name>` and `zfs-csi <name> --help`. */
  readonly usage: string;
  /** Runs it with the arguments after its name; resolves to the exit code. */
  run(args: readonly string[], io: CliIo): Promise<number>;
}

/** One entry of the table. */
export interface Subcommand {
  /** One line for `zfs-csi help`. */
  readonly summary: string;
  readonly load: () => Promise<SubcommandModule>;
}

/** Every subcommand. */
export const SUBCOMMANDS: Readonly<Record<string, Subcommand>> = {
  list: {
    summary: "list volumes and host volumes: size, use, staged/published, backups",
    load: () => import("./list.ts"),
  },
  undelete: {
    summary: "undo a delete: give a set-aside volume or snapshot its name back",
    load: () => import("./undelete.ts"),
  },
  purge: {
    summary: "destroy what deletes set aside now, with the purge's checks",
    load: () => import("./purge.ts"),
  },
  adopt: {
    summary: "hand an existing dataset below the parent over to zfs-csi",
    load: () => import("./adopt.ts"),
  },
  verify: {
    summary: "restore a stored backup into a scratch dataset, check it, remove it",
    load: () => import("./verify.ts"),
  },
  backup: {
    summary: "backup set VOLUME --interval TIME: give a volume its own backup schedule",
    load: () => import("./backup.ts"),
  },
  snapshots: {
    summary: "a volume's snapshots, stored and local, newest first, and which restore",
    load: () => import("./snapshots.ts"),
  },
  restore: {
    summary: "restore VOLUME[@SNAPSHOT] --to NAME: a snapshot into a new volume",
    load: () => import("./restore.ts"),
  },
  store: {
    summary: "store check: reachable, bucket, listing, put/get/delete, conditional writes",
    load: () => import("./store_check.ts"),
  },
  takeover: {
    summary: "take a volume that follows its job from a lost holder, from the store's last copy",
    load: () => import("../follow/takeover_command.ts"),
  },
  demo: {
    summary: "drive a running plugin through a volume's life over its socket",
    load: () => import("./demo.ts"),
  },
};

/** Names the executable gives another meaning (Nomad's host volume operations, main.ts). */
export const RESERVED_NAMES: readonly string[] = ["fingerprint", "create", "delete"];
