/**
 * Staging and target paths from the CO are checked before anything is mounted there: absolute,
 * no "." or "..", inside a configured base directory, and with no symlink on the way.
 */

import { Code, CsiError } from "../errors.ts";

/**
 * Normalises `path` and checks that it lies strictly inside one of `roots` without crossing a
 * symlink in the part that exists. Returns the normalised path.
 * @throws {CsiError} INVALID_ARGUMENT naming the field and the reason
 */
export async function checkPathInside(
  field: string,
  path: string,
  roots: readonly string[],
): Promise<string> {
  const bad = (why: string) => new CsiError(Code.INVALID_ARGUMENT, `${field} "${path}" ${why}`);
  if (path === "") throw new CsiError(Code.INVALID_ARGUMENT, `${field} is required`);
  // deno-lint-ignore no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(path)) throw bad("contains control characters");
  if (path.length > 4000) throw bad("is too long");
  if (!path.startsWith("/")) throw bad("is not absolute");
  const parts = path.split("/").filter((p) => p !== "");
  if (parts.some((p) => p === "." || p === "..")) throw bad(`must not contain "." or ".."`);
  const normal = "/" + parts.join("/");
  const root = roots.find((r) => normal.startsWith(r + "/"));
  if (root === undefined) {
    throw bad(`is outside the staging/publish base directories (${roots.join(", ")})`);
  }
  // Find the deepest existing ancestor (or the path itself) and make sure resolving it
  // follows no symlink below the base directory.
  const rel = normal.slice(root.length + 1).split("/");
  let realRoot: string;
  try {
    realRoot = await Deno.realPath(root);
  } catch (err) {
    throw bad(
      err instanceof Deno.errors.NotFound
        ? `is inside base directory "${root}", which does not exist`
        : `is inside base directory "${root}", which cannot be read (${(err as Error).name})`,
    );
  }
  for (let n = rel.length; n >= 0; n--) {
    const candidate = n === 0 ? root : `${root}/${rel.slice(0, n).join("/")}`;
    let real: string;
    try {
      real = await Deno.realPath(candidate);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
      // Nothing to resolve to, but the name itself exists: a dangling symbolic link.
      if (await Deno.lstat(candidate).then(() => true, () => false)) {
        throw bad("passes through a symbolic link");
      }
      continue;
    }
    const expected = n === 0 ? realRoot : `${realRoot}/${rel.slice(0, n).join("/")}`;
    if (real !== expected) throw bad("passes through a symbolic link");
    break;
  }
  return normal;
}
