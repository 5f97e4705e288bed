/**
 * One SHA-256 of a directory tree, for tests that compare a restored filesystem with its
 * source: every entry's relative path (sorted), type and permission bits, a file's content
 * hash, a symlink's target. Times and owners are left out (a test cannot keep them apart).
 */

import { createHash } from "node:crypto";

/** Lines describing each entry below `root`, sorted by path (for a readable diff). */
export async function treeListing(root: string): Promise<string[]> {
  const lines: string[] = [];
  async function walk(rel: string): Promise<void> {
    for await (const entry of Deno.readDir(rel === "" ? root : `${root}/${rel}`)) {
      const path = rel === "" ? entry.name : `${rel}/${entry.name}`;
      if (rel === "" && entry.name === ".zfs") continue;
      const full = `${root}/${path}`;
      const info = await Deno.lstat(full);
      const mode = ((info.mode ?? 0) & 0o7777).toString(8).padStart(4, "0");
      if (info.isSymlink) {
        lines.push(`${path}\tlink\t${await Deno.readLink(full)}`);
      } else if (info.isDirectory) {
        lines.push(`${path}\tdir\t${mode}`);
        await walk(path);
      } else {
        lines.push(`${path}\tfile\t${mode}\t${info.size}\t${await fileHash(full)}`);
      }
    }
  }
  await walk("");
  return lines.sort();
}

/** The SHA-256 (hex) of {@linkcode treeListing}. */
export async function treeHash(root: string): Promise<string> {
  const listing = await treeListing(root);
  return createHash("sha256").update(listing.join("\n")).digest("hex");
}

async function fileHash(path: string): Promise<string> {
  const hash = createHash("sha256");
  const file = await Deno.open(path);
  // The readable closes the file once read to its end.
  for await (const chunk of file.readable) hash.update(chunk);
  return hash.digest("hex");
}
