import assert from "node:assert/strict";
import {
  look,
  type LstatFn,
  type PathStat,
  sameFile,
  showsRoot,
  walkToParent,
} from "./identity.ts";

const dir = (dev: number, ino: number): PathStat => ({ dev, ino, isDirectory: true });

/** lstat over a fixed map of paths; "EACCES" entries throw PermissionDenied. */
function fakeLstat(paths: Record<string, PathStat | "EACCES">): LstatFn {
  return (path) => {
    const found = paths[path];
    if (found === "EACCES") return Promise.reject(new Deno.errors.PermissionDenied(path));
    if (!found) return Promise.reject(new Deno.errors.NotFound(path));
    return Promise.resolve(found);
  };
}

Deno.test("showsRoot wants the root's device and inode on another device than the parent", () => {
  const root = { dev: 50, ino: 34 };
  assert.equal(showsRoot(dir(50, 34), dir(1, 2), root), true);
  assert.equal(showsRoot(dir(50, 35), dir(1, 2), root), false, "another directory of it");
  assert.equal(showsRoot(dir(51, 34), dir(1, 2), root), false, "another filesystem");
  assert.equal(showsRoot(dir(50, 34), dir(50, 2), root), false, "inside it, not a mount here");
  assert.equal(showsRoot({ ...dir(50, 34), isDirectory: false }, dir(1, 2), root), false);
  assert.equal(showsRoot("missing", dir(1, 2), root), false);
  assert.equal(showsRoot(dir(50, 34), "unknown", root), false);
});

Deno.test("sameFile wants the same device and inode", () => {
  assert.equal(sameFile(dir(1, 9), { dev: 1, ino: 9 }), true);
  assert.equal(sameFile(dir(1, 9), { dev: 1, ino: 8 }), false);
  assert.equal(sameFile(dir(1, 9), { dev: 2, ino: 9 }), false);
  assert.equal(sameFile(dir(1, 9), undefined), false);
  assert.equal(sameFile("missing", { dev: 1, ino: 9 }), false);
});

Deno.test("walkToParent finds another device between the base directory and the path", async () => {
  const roots = ["/base"];
  const lstat = fakeLstat({
    "/base": dir(1, 2),
    "/base/a": dir(1, 3),
    "/base/a/b": dir(9, 1),
    "/base/c": "EACCES",
  });
  assert.deepEqual(await walkToParent("/base/a/x", roots, lstat), {
    crosses: false,
    parent: dir(1, 3),
    dirs: [["/base/a", dir(1, 3)]],
  });
  assert.deepEqual(await walkToParent("/base/x", roots, lstat), {
    crosses: false,
    parent: dir(1, 2),
    dirs: [],
  });
  assert.equal((await walkToParent("/base/a/b/x", roots, lstat)).crosses, true);
  assert.deepEqual(await walkToParent("/base/a/m/x/y", roots, lstat), {
    crosses: false,
    parent: "missing",
    dirs: [["/base/a", dir(1, 3)]],
  });
  assert.equal((await walkToParent("/base/c/x", roots, lstat)).crosses, "unknown");
  assert.equal((await walkToParent("/other/x", roots, lstat)).crosses, "unknown");
  assert.equal((await walkToParent("/gone/x", ["/gone"], lstat)).crosses, "unknown");
});

Deno.test("look answers missing, unknown or the stat", async () => {
  const lstat = fakeLstat({ "/a": dir(1, 2), "/b": "EACCES" });
  assert.deepEqual(await look(lstat, "/a"), dir(1, 2));
  assert.equal(await look(lstat, "/b"), "unknown");
  assert.equal(await look(lstat, "/c"), "missing");
  // A FUSE daemon that never answers: undecided after the time limit, not a hung call.
  const never = Promise.withResolvers<PathStat>();
  assert.equal(await look(() => never.promise, "/hung", 10), "unknown");
});
