/**
 * The file store never follows a symbolic link below its root, neither to read nor to write
 * (a link planted in the store could otherwise make the plugin, which runs as root, write
 * outside it). An integration test only because Deno creates symlinks only with unscoped
 * --allow-read and --allow-write, which unit tests do not get.
 */

import assert from "node:assert/strict";
import { FileStore } from "../../src/store/file_store.ts";
import { assertRejectsKind } from "../support/store_contract.ts";

const encoder = new TextEncoder();

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: "zfs-csi-file-store-links-" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

async function names(dir: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir(dir)) out.push(e.name);
  return out.sort();
}

Deno.test("FileStore never follows a symbolic link below its root", async () => {
  await using dir = await tempDir();
  const root = `${dir.path}/store`;
  const outside = `${dir.path}/outside`;
  await Deno.mkdir(root);
  await Deno.mkdir(outside);
  await Deno.writeTextFile(`${outside}/secret.json`, "outside the store");
  await Deno.symlink(outside, `${root}/v1`);
  await Deno.symlink(`${outside}/secret.json`, `${root}/top.json`);
  const store = new FileStore(root);
  const bytes = encoder.encode("x");
  for (const key of ["v1/secret.json", "v1/new/x.json", "top.json"]) {
    await assertRejectsKind(store.getBytes(key), "denied", key);
    await assertRejectsKind(store.getStream(key), "denied", key);
    await assertRejectsKind(store.putBytes(key, bytes), "denied", key);
    await assertRejectsKind(store.putBytes(key, bytes, { ifNoneMatch: "*" }), "denied", key);
    await assertRejectsKind(store.putStream(key, ReadableStream.from([bytes])), "denied", key);
    await assertRejectsKind(store.delete(key), "denied", key);
  }
  const error = await assertRejectsKind(store.list("v1/"), "denied");
  assert.match(error.message, /symbolic link/);
  assert.match(error.message, new RegExp(`${root}/v1`));
  assert.deepEqual(await store.list(""), [], "list skips links");
  assert.deepEqual(await names(outside), ["secret.json"], "nothing written outside");
  assert.equal(await Deno.readTextFile(`${outside}/secret.json`), "outside the store");
});

Deno.test("FileStore refuses its own directories when they are links out of the root", async () => {
  await using dir = await tempDir();
  const root = `${dir.path}/store`;
  await Deno.mkdir(root);
  await Deno.mkdir(`${dir.path}/elsewhere`);
  await Deno.symlink(`${dir.path}/elsewhere`, `${root}/.tmp`);
  const store = new FileStore(root);
  const error = await assertRejectsKind(
    store.putStream("k.zfs", ReadableStream.from([encoder.encode("x")])),
    "denied",
  );
  assert.match(error.message, /\.tmp must be a directory/);
  assert.deepEqual(await names(`${dir.path}/elsewhere`), []);
});
