import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Code, CsiError } from "../errors.ts";
import { checkPathInside, mountBetween } from "./paths.ts";

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: "zfs-csi-paths-" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

async function rejectsInvalid(p: Promise<unknown>, message: string): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof CsiError, `expected a CsiError, got ${String(err)}`);
    assert.equal(err.code, Code.INVALID_ARGUMENT);
    assert.equal(err.message, message);
    return true;
  });
}

Deno.test("checkPathInside returns the normalised path inside a root", async () => {
  await using tmp = await tempDir();
  const root = tmp.path;
  await Deno.mkdir(`${root}/staging/v1`, { recursive: true });
  assert.equal(
    await checkPathInside("target_path", `${root}/staging/v1`, [root]),
    `${root}/staging/v1`,
  );
  assert.equal(
    await checkPathInside("target_path", `/${root}//staging///v1/rw/`, [root]),
    `${root}/staging/v1/rw`,
  );
  // A path that does not exist yet is fine: the node service creates it.
  assert.equal(
    await checkPathInside("target_path", `${root}/per-alloc/a1/db[0]/my vol`, [root]),
    `${root}/per-alloc/a1/db[0]/my vol`,
  );
});

Deno.test("checkPathInside accepts a path inside the second of several roots", async () => {
  await using a = await tempDir();
  await using b = await tempDir();
  assert.equal(await checkPathInside("p", `${b.path}/x`, [a.path, b.path]), `${b.path}/x`);
});

Deno.test("checkPathInside refuses paths outside every root", async () => {
  await using tmp = await tempDir();
  const root = tmp.path;
  const why = `is outside the staging/publish base directories (${root})`;
  await rejectsInvalid(
    checkPathInside("target_path", "/etc/x", [root]),
    `target_path "/etc/x" ${why}`,
  );
  await rejectsInvalid(
    checkPathInside("target_path", root, [root]),
    `target_path "${root}" ${why}`,
  );
  await rejectsInvalid(
    checkPathInside("target_path", `${root}/`, [root]),
    `target_path "${root}/" ${why}`,
  );
  await rejectsInvalid(
    checkPathInside("target_path", `${root}-sibling/x`, [root]),
    `target_path "${root}-sibling/x" ${why}`,
  );
});

Deno.test("checkPathInside refuses . and .. components", async () => {
  await using tmp = await tempDir();
  for (const path of [`${tmp.path}/a/../../etc`, `${tmp.path}/..`, `${tmp.path}/./a`]) {
    await rejectsInvalid(
      checkPathInside("staging_target_path", path, [tmp.path]),
      `staging_target_path "${path}" must not contain "." or ".."`,
    );
  }
});

Deno.test("checkPathInside refuses relative, empty and control-character paths", async () => {
  await using tmp = await tempDir();
  await rejectsInvalid(
    checkPathInside("target_path", "local/csi/x", [tmp.path]),
    'target_path "local/csi/x" is not absolute',
  );
  await rejectsInvalid(checkPathInside("target_path", "", [tmp.path]), "target_path is required");
  await rejectsInvalid(
    checkPathInside("target_path", `${tmp.path}/a\nb`, [tmp.path]),
    `target_path "${tmp.path}/a\nb" contains control characters`,
  );
  const long = `${tmp.path}/${"x".repeat(4000)}`;
  await rejectsInvalid(
    checkPathInside("target_path", long, [tmp.path]),
    `target_path "${long}" is too long`,
  );
});

// Deno.symlink needs unscoped --allow-write, which unit tests do not get, so the symlinks
// live in a committed fixture tree: root/out -> ../outside, root/inside -> real,
// root/dangling -> ../missing-target/dir, and rootlink -> root.
const FIXTURE = fileURLToPath(new URL("../../tests/fixtures/paths", import.meta.url));
const ROOT = `${FIXTURE}/root`;

Deno.test("checkPathInside accepts a real directory in the symlink fixture", async () => {
  assert.equal(await checkPathInside("target_path", `${ROOT}/real`, [ROOT]), `${ROOT}/real`);
  assert.equal(
    await checkPathInside("target_path", `${ROOT}/real/x/rw`, [ROOT]),
    `${ROOT}/real/x/rw`,
  );
});

Deno.test("checkPathInside refuses a symlink inside the root that points out", async () => {
  for (const path of [`${ROOT}/out`, `${ROOT}/out/rw`, `${ROOT}/out/deeper/rw`]) {
    await rejectsInvalid(
      checkPathInside("target_path", path, [ROOT]),
      `target_path "${path}" passes through a symbolic link`,
    );
  }
});

Deno.test("checkPathInside refuses a symlink even when it points inside the root", async () => {
  for (const path of [`${ROOT}/inside`, `${ROOT}/inside/rw`]) {
    await rejectsInvalid(
      checkPathInside("target_path", path, [ROOT]),
      `target_path "${path}" passes through a symbolic link`,
    );
  }
});

Deno.test("checkPathInside refuses a dangling symlink inside the root", async () => {
  for (const path of [`${ROOT}/dangling`, `${ROOT}/dangling/rw`]) {
    await rejectsInvalid(
      checkPathInside("target_path", path, [ROOT]),
      `target_path "${path}" passes through a symbolic link`,
    );
  }
});

Deno.test("checkPathInside accepts a root that is itself a symlink", async () => {
  const root = `${FIXTURE}/rootlink`;
  assert.equal(await checkPathInside("target_path", `${root}/real/rw`, [root]), `${root}/real/rw`);
  await rejectsInvalid(
    checkPathInside("target_path", `${root}/out/rw`, [root]),
    `target_path "${root}/out/rw" passes through a symbolic link`,
  );
});

Deno.test("checkPathInside refuses a root that does not exist", async () => {
  await using tmp = await tempDir();
  const root = `${tmp.path}/missing`;
  await rejectsInvalid(
    checkPathInside("target_path", `${root}/x`, [root]),
    `target_path "${root}/x" is inside base directory "${root}", which does not exist`,
  );
});

Deno.test("mountBetween finds a mount between the base dir and the path", () => {
  const roots = ["/csi", "/local/csi"];
  const mounts = ["/", "/local/csi", "/local/csi/per-alloc/bind", "/csi/staging/v1/rw"];
  assert.equal(
    mountBetween("/local/csi/per-alloc/bind/x", roots, mounts),
    "/local/csi/per-alloc/bind",
  );
  assert.equal(
    mountBetween("/local/csi/per-alloc/bind/x/y", roots, mounts),
    "/local/csi/per-alloc/bind",
  );
  // Below a volume's own staging mount: its data, not a place for a target.
  assert.equal(mountBetween("/csi/staging/v1/rw/t", roots, mounts), "/csi/staging/v1/rw");
});

Deno.test("mountBetween ignores the path itself, the base dir and mounts above or beside it", () => {
  const roots = ["/local/csi"];
  const mounts = ["/", "/local", "/local/csi", "/local/csi/per-alloc/a1/v/rw", "/local/csi-x"];
  // The path's own mount (a repeated publish) and the base dir's (a container's bind mount).
  assert.equal(mountBetween("/local/csi/per-alloc/a1/v/rw", roots, mounts), undefined);
  assert.equal(mountBetween("/local/csi/per-alloc/a2/v/rw", roots, mounts), undefined);
  // A mount whose name only shares a prefix is not an ancestor.
  assert.equal(mountBetween("/local/csi/per-alloc/a1/v/rw-2", roots, mounts), undefined);
  assert.equal(mountBetween("/local/csi-x/y", roots, mounts), undefined);
});

Deno.test("checkPathInside accepts a directory a concurrent call creates while it looks", async () => {
  await using tmp = await tempDir();
  const root = tmp.path;
  const target = `${root}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(`${root}/per-alloc/a1/v1`, { recursive: true });
  // The first realPath of the target finds nothing; by the lstat that follows, a concurrent
  // publish has made the directory.
  let created = false;
  const racing = {
    realPath: async (p: string) => {
      if (p === target && !created) {
        created = true;
        await Deno.mkdir(target);
        throw new Deno.errors.NotFound(`no such file: ${p}`);
      }
      return await Deno.realPath(p);
    },
    lstat: (p: string) => Deno.lstat(p),
  };
  assert.equal(await checkPathInside("target_path", target, [root], racing), target);
  assert.equal(created, true);
});
