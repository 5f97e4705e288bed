import assert from "node:assert/strict";
import { FileLocks } from "./file_lock.ts";
import { StoreError } from "./store.ts";

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-file-lock-" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

Deno.test("FileLocks: one holder at a time, across instances on one directory", async () => {
  await using dir = await tempDir();
  const locks = [new FileLocks(`${dir.path}/locks`), new FileLocks(`${dir.path}/locks`)];
  let inside = 0;
  let most = 0;
  await Promise.all(Array.from({ length: 12 }, async (_, i) => {
    await using _lock = await locks[i % 2]!.acquire("k", "key k");
    inside++;
    most = Math.max(most, inside);
    await sleep(2);
    inside--;
  }));
  assert.equal(most, 1);
  assert.deepEqual([...Deno.readDirSync(`${dir.path}/locks`)], [], "all released");
});

Deno.test("FileLock.checkHeld refuses once the lock was held longer than holdMs", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path, { holdMs: 50, staleMs: 1000 });
  await using lock = await locks.acquire("k", '"k" in the test store');
  lock.checkHeld();
  await sleep(80);
  assert.throws(
    () => lock.checkHeld(),
    (err) =>
      err instanceof StoreError && err.kind === "unavailable" &&
      /"k" in the test store/.test(err.message),
  );
});

Deno.test("FileLock.release leaves a lock that was broken and taken by another", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path, { staleMs: 1000, holdMs: 50 });
  // Many rounds with no pause: a removed lock's inode often comes back to the next mkdir within
  // the same coarse-clock tick, which an identity by inode and mtime could not tell apart.
  for (let round = 0; round < 50; round++) {
    const lock = await locks.acquire("k", "k");
    await Deno.remove(`${dir.path}/k`, { recursive: true });
    const other = await locks.acquire("k", "k");
    await lock.release();
    assert.ok(await exists(`${dir.path}/k`), `round ${round}: the other holder's lock stays`);
    await other.release();
    assert.ok(!await exists(`${dir.path}/k`), `round ${round}: released`);
  }
});

Deno.test("FileLock.release leaves a lock another process is still making (no token yet)", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path);
  const lock = await locks.acquire("k", "k");
  await Deno.remove(`${dir.path}/k`, { recursive: true });
  await Deno.mkdir(`${dir.path}/k`);
  await lock.release();
  assert.ok(await exists(`${dir.path}/k`));
});

Deno.test("FileLocks breaks a lock whose maker died before writing its token", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path, { staleMs: 100, holdMs: 50, waitMs: 5000 });
  await Deno.mkdir(`${dir.path}/k`);
  const start = performance.now();
  const lock = await locks.acquire("k", "k");
  assert.ok(performance.now() - start >= 100);
  assert.ok(await exists(`${dir.path}/k/holder`));
  await lock.release();
});

Deno.test("FileLocks breaks a dead holder's lock with its token in it", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path, { staleMs: 100, holdMs: 50, waitMs: 5000 });
  const dead = await locks.acquire("k", "k");
  const token = await Deno.readTextFile(`${dir.path}/k/holder`);
  const lock = await locks.acquire("k", "k");
  assert.notEqual(await Deno.readTextFile(`${dir.path}/k/holder`), token, "a new token");
  await dead.release();
  assert.ok(await exists(`${dir.path}/k/holder`), "the dead holder's late release removes nothing");
  await lock.release();
  assert.ok(!await exists(`${dir.path}/k`));
});

Deno.test("FileLocks breaks a lock left unchanged for staleMs, but not a changing one", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path, { staleMs: 200, holdMs: 50, waitMs: 5000 });
  // A live holder's lock that keeps changing (replaced, never absent) is never taken as stale.
  await Deno.mkdir(`${dir.path}/k`);
  let stop = false;
  const churn = (async () => {
    while (!stop) {
      await sleep(20);
      await Deno.mkdir(`${dir.path}/k.next`);
      await Deno.rename(`${dir.path}/k.next`, `${dir.path}/k`);
    }
    await Deno.remove(`${dir.path}/k`);
  })();
  let taken = false;
  const waiting = locks.acquire("k", "k").then((lock) => {
    taken = true;
    return lock;
  });
  try {
    await sleep(500);
    assert.equal(taken, false, "a changing lock is not broken");
  } finally {
    stop = true;
    await churn;
    await (await waiting).release();
  }
  // A dead holder's lock: broken after it was seen unchanged for staleMs.
  await Deno.mkdir(`${dir.path}/k`);
  const start = performance.now();
  const lock = await locks.acquire("k", "k");
  assert.ok(performance.now() - start >= 200);
  await lock.release();
  assert.ok(!await exists(`${dir.path}/k`));
});

Deno.test("FileLocks breaks a break guard left by a waiter that died breaking", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(dir.path, { staleMs: 100, holdMs: 50, waitMs: 5000 });
  await Deno.mkdir(`${dir.path}/k`);
  await Deno.mkdir(`${dir.path}/k.break`);
  const lock = await locks.acquire("k", "k");
  assert.ok(!await exists(`${dir.path}/k.break`));
  await lock.release();
});

Deno.test("FileLocks never makes the directory above its own (a store that is gone)", async () => {
  await using dir = await tempDir();
  const locks = new FileLocks(`${dir.path}/store/.locks`);
  await assert.rejects(locks.acquire("k", "k"), Deno.errors.NotFound);
  assert.ok(!await exists(`${dir.path}/store`));
});

Deno.test("FileLocks refuses a hold time that is not below the stale time", () => {
  assert.throws(() => new FileLocks("/tmp/x", { holdMs: 30_000, staleMs: 30_000 }), RangeError);
});
