/**
 * The zfs argument lists the unit tests expect, written out once: `zfs get` of datasets and of
 * a tree, and `zfs create` and `zfs clone` with `-o name=value` options in the order given.
 * Property lists are comma-separated strings, as zfs takes them.
 */

/** The `-o` option of every parsable `zfs get` the plugin runs. */
const COLUMNS = ["-o", "name,property,value,source"];

/** The `-o` option marking a dataset as the plugin's, on every one it creates or clones. */
export const MANAGED_OPTION = "org.zfs-csi:managed=yes";

const options = (opts: readonly string[]) => opts.flatMap((o) => ["-o", o]);

/** Expected argvs, each starting with `program` (none when undefined, as args.ts builds them). */
export interface ZfsArgv {
  /** `get -Hp -o name,property,value,source <props> <names...>` */
  get(props: string, ...names: string[]): string[];
  /** `get -Hp -r -d <depth> -o name,property,value,source <props> <root>` */
  tree(root: string, depth: number, props: string): string[];
  /** `create [-o <option>]... <dataset>` */
  create(dataset: string, ...opts: string[]): string[];
  /** `clone [-o <option>]... <snapshot> <target>` */
  clone(snapshot: string, target: string, ...opts: string[]): string[];
}

/** Expected zfs argvs of `program`, or without a program name. */
export function zfsArgv(program?: string): ZfsArgv {
  const p = program === undefined ? [] : [program];
  return {
    get: (props, ...names) => [...p, "get", "-Hp", ...COLUMNS, props, ...names],
    tree: (root, depth, props) => [
      ...p,
      "get",
      "-Hp",
      "-r",
      "-d",
      String(depth),
      ...COLUMNS,
      props,
      root,
    ],
    create: (dataset, ...opts) => [...p, "create", ...options(opts), dataset],
    clone: (snapshot, target, ...opts) => [...p, "clone", ...options(opts), snapshot, target],
  };
}
