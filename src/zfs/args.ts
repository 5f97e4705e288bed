/**
 * Pure argv builders for zfs and zpool. Each takes a small typed spec and returns the exact
 * argument list (without the program name). No shell, no joined strings.
 */

/** ZFS properties to set, by name. */
export type Properties = Readonly<Record<string, string>>;

const PROPERTY_NAME = /^[a-z][a-z0-9_.:+-]*$/;

/**
 * Checks one property name and value before they reach an argv.
 * @throws {TypeError} for names outside the ZFS property syntax or values with control characters
 */
export function checkProperty(name: string, value: string): void {
  if (!PROPERTY_NAME.test(name)) throw new TypeError(`Invalid ZFS property name "${name}"`);
  // deno-lint-ignore no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(value)) {
    throw new TypeError(`Value of ZFS property "${name}" contains control characters`);
  }
}

/** `-o name=value` pairs for `zfs create`, in a stable (sorted) order. */
export function propertyArgs(props: Properties): string[] {
  const out: string[] = [];
  for (const name of Object.keys(props).sort()) {
    const value = props[name]!;
    checkProperty(name, value);
    out.push("-o", `${name}=${value}`);
  }
  return out;
}

/** Machine-readable `zfs get` of some properties of some datasets. */
export function getArgs(datasets: readonly string[], props: readonly string[]): string[] {
  for (const p of props) checkProperty(p, "");
  return ["get", "-Hp", "-o", "name,property,value,source", props.join(","), ...datasets];
}

/** `zfs create` of one filesystem; its parent must exist (no `-p`). */
export function createArgs(dataset: string, props: Properties = {}): string[] {
  return ["create", ...propertyArgs(props), dataset];
}

/** `zfs set` of one property (older ZFS accepts one per call). */
export function setArgs(dataset: string, name: string, value: string): string[] {
  checkProperty(name, value);
  return ["set", `${name}=${value}`, dataset];
}

/** `zfs mount` of one filesystem at its own mountpoint. */
export function mountArgs(dataset: string): string[] {
  return ["mount", dataset];
}

/** `zpool list` of the name and health of one pool. */
export function poolHealthArgs(pool: string): string[] {
  return ["list", "-H", "-o", "name,health", pool];
}
