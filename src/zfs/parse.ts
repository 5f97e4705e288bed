/**
 * Total parsers of zfs machine output (`-H -p`, tab separated). They return typed records or
 * throw a SyntaxError that says what was wrong; they never guess.
 */

/** One property as `zfs get -Hp` reports it. */
export interface PropertyValue {
  readonly value: string;
  readonly source: string;
}

/** Properties of one dataset, by property name. */
export type PropertyMap = ReadonlyMap<string, PropertyValue>;

/**
 * Parses `zfs get -Hp -o name,property,value,source` output.
 * @throws {SyntaxError} for a line without exactly four tab-separated fields
 */
export function parseGet(stdout: string): Map<string, Map<string, PropertyValue>> {
  const out = new Map<string, Map<string, PropertyValue>>();
  for (const line of stdout.split("\n")) {
    if (line === "") continue;
    const fields = line.split("\t");
    if (fields.length !== 4) {
      throw new SyntaxError(`Cannot parse zfs get line ${JSON.stringify(line)}: expected 4 fields`);
    }
    const [name, property, value, source] = fields as [string, string, string, string];
    let props = out.get(name);
    if (!props) out.set(name, props = new Map());
    props.set(property, { value, source });
  }
  return out;
}

/**
 * Whether a dataset carries our marker itself. A marker inherited from a parent does not count:
 * an operator who sets it on the parent dataset must not hand every foreign child to the plugin.
 * "received" counts, so a volume moved with `zfs send -p | zfs receive` stays ours.
 */
export function hasOwnMarker(props: PropertyMap, property: string, value: string): boolean {
  const v = props.get(property);
  return v !== undefined && v.value === value &&
    (v.source === "local" || v.source.startsWith("received"));
}

/** Pool name and health as `zpool list -H -o name,health` reports them. */
export interface PoolHealth {
  readonly name: string;
  readonly health: string;
}

/**
 * Parses `zpool list -H -o name,health` output.
 * @throws {SyntaxError} for a line without exactly two tab-separated fields
 */
export function parsePoolHealth(stdout: string): PoolHealth[] {
  const out: PoolHealth[] = [];
  for (const line of stdout.split("\n")) {
    if (line === "") continue;
    const fields = line.split("\t");
    if (fields.length !== 2) {
      throw new SyntaxError(
        `Cannot parse zpool list line ${JSON.stringify(line)}: expected 2 fields`,
      );
    }
    out.push({ name: fields[0]!, health: fields[1]! });
  }
  return out;
}

/**
 * Reads a numeric property (`-p` prints bytes as integers). "-" and "none" mean unset (0).
 * @throws {SyntaxError} for anything that is not a whole number
 */
export function parseBytes(value: string): number {
  if (value === "-" || value === "none") return 0;
  if (!/^\d+$/.test(value)) throw new SyntaxError(`Cannot parse "${value}" as a byte count`);
  return Number(value);
}
