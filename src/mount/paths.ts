/**
 * Staging and target paths from the CO are checked before anything is mounted there: absolute,
 * no "." or "..", inside a configured base directory, and with no symlink on the way.
 */

import { Code, CsiError } from "../errors.ts";

/** The file system calls {@linkcode checkPathInside} makes; replaceable in tests. */
export interface PathFs {
  realPath(path: string): Promise<string>;
  lstat(path: string): Promise<Deno.FileInfo>;
}

const DENO_FS: PathFs = {
  realPath: (p) => Deno.realPath(p),
  lstat: (p) => Deno.lstat(p),
};

/**
 * Normalises `path` and checks that it lies strictly inside one of `roots` without crossing a
 * symlink in the part that exists. Returns the normalised path.
 * @throws {CsiError} INVALID_ARGUMENT naming the field and the reason
 */
export async function checkPathInside(
  field: string,
  path: string,
  roots: readonly string[],
  fs: PathFs = DENO_FS,
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
    realRoot = await fs.realPath(root);
  } catch (err) {
    throw bad(
      err instanceof Deno.errors.NotFound
        ? `is inside base directory "${root}", which does not exist`
        : `is inside base directory "${root}", which cannot be read (${(err as Error).name})`,
    );
  }
  for (let n = rel.length; n >= 0; n--) {
    const candidate = n === 0 ? root : `${root}/${rel.slice(0, n).join("/")}`;
    let real: string | undefined;
    try {
      real = await fs.realPath(candidate);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
      const info = await fs.lstat(candidate).catch(() => undefined);
      // Nothing to resolve to, but the name itself is a symbolic link: a dangling one.
      if (info?.isSymlink) throw bad("passes through a symbolic link");
      // Made meanwhile, by a concurrent call creating the directory: resolve it now.
      if (info) real = await fs.realPath(candidate).catch(() => undefined);
      if (real === undefined) continue;
    }
    const expected = n === 0 ? realRoot : `${realRoot}/${rel.slice(0, n).join("/")}`;
    if (real !== expected) throw bad("passes through a symbolic link");
    break;
  }
  return normal;
}

/**
 * The mount point lying strictly between a base directory in `roots` and `path`, if any. A path
 * below another mount (a tmpfs, a bind mount of a directory elsewhere, a volume's own mount)
 * is on that filesystem, not the base directory's: creating or removing a directory there
 * could change files outside the base directory, which no symlink check can see.
 */
export function mountBetween(
  path: string,
  roots: readonly string[],
  mountPoints: Iterable<string>,
): string | undefined {
  const inside = roots.filter((r) => path.startsWith(r + "/"));
  for (const m of mountPoints) {
    if (path.startsWith(m + "/") && inside.some((r) => m.startsWith(r + "/"))) return m;
  }
  return undefined;
}
