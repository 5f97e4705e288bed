/**
 * The output of real commands on OpenZFS, captured in the VM by tools/openzfs-vm/in-vm.sh
 * (capture_fixtures) into tests/fixtures/openzfs/ (see its README): what the unit tests of the
 * parsers read instead of output written by hand.
 */

import { parseGet, type PropertyMap } from "../../src/zfs/parse.ts";

const DIR = new URL("../fixtures/openzfs/", import.meta.url);

/** A captured file's text. */
export function openZfsFixture(name: string): string {
  return Deno.readTextFileSync(new URL(name, DIR));
}

/**
 * The exit code the capture recorded for `name` (its `exit_codes.txt`).
 * @throws {Error} when it recorded none
 */
export function openZfsExitCode(name: string): number {
  const prefix = `${name} exit `;
  const line = openZfsFixture("exit_codes.txt").split("\n").find((l) => l.startsWith(prefix));
  if (line === undefined) throw new Error(`exit_codes.txt records no "${name}"`);
  return Number(line.slice(prefix.length));
}

/** The properties of `dataset` in a captured `zfs get -Hp -o name,property,value,source`. */
export function openZfsProperties(file: string, dataset: string): PropertyMap {
  const props = parseGet(openZfsFixture(file)).get(dataset);
  if (!props) throw new Error(`${file} holds nothing of "${dataset}"`);
  return props;
}
