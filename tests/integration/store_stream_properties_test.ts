/**
 * Issue 21, defects 1 and 7, through the plugin as it ships, on real pools, with a directory
 * store that a test writes the way anyone who can write the store could:
 *
 * 1. A `zfs send -p` stream of a dataset with `mountpoint` under the test's directory,
 *    `setuid=on`, `devices=on` and a foreign user property, stored with a manifest carrying its
 *    true SHA-256: CreateVolume from it answers DATA_LOSS naming them; nothing is left in the
 *    pool, nothing is mounted where the stream says, no dataset keeps a received property. A
 *    stream carrying only what the plugin excludes (`-x`) is restored on OpenZFS with none of it
 *    (mounted where the plugin mounts volumes) and refused on zfs-fuse (no `-x`).
 * 2. A stored stream whose snapshot is not the manifest's (guid): DATA_LOSS, the restore's
 *    temporary dataset removed; once the store is repaired, the same CreateVolume succeeds.
 * 3. A follow volume whose head a store writer moves to such an incremental (`zfs send -p -i`):
 *    the standby copy's background receive and a move onto the former holder's clean copy
 *    (incremental receives into them) and a stage on a node without a copy (a full receive into
 *    a hidden dataset) each refuse it the first time; the former holder's copy is put back as it
 *    was (the first stream with properties a dataset receives clears its local properties: the
 *    plugin's markers, `readonly`), nothing is left of the full receive. Once a copy overrode
 *    what the stream set, the stream decides nothing there any more and is received like any
 *    other (the standby's next tick, its stage): mounted where the plugin mounts volumes. No
 *    copy is ever mounted where the stream says or keeps a property it decided.
 *
 * Each fails on the code before issue 21: the restore kept the stream's properties (the first
 * stage mounted the volume at the stream's mountpoint), the failed restore left its `.restore-*`
 * dataset and the repaired CreateVolume answered FAILED_PRECONDITION "in the way of a restore".
 * On OpenZFS (tools/openzfs-vm/) step 1 also shows `-x` at work and a raw `-w -p` stream's
 * keylocation losing to the operator's.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../../src/errors.ts";
import type { SnapshotManifest } from "../../src/store/layout.ts";
import { rejects } from "../support/csi_client.ts";
import {
  createNode,
  type FollowNode,
  logTail,
  ownerOf,
  startPlugin,
} from "../support/follow_flows.ts";
import { claimVolume, createVolumeRequest, hostMounts } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { fileStoreUnderTest, type StoreUnderTest } from "../support/store_flows.ts";
import { print } from "../support/store_trials.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

/** CreateSnapshot and restores answer within 90 s; the client waits longer. */
const SLOW_CALL_MS = 120_000;
/** A stage may receive: Nomad gives it no deadline. */
const STAGE_MS = 180_000;
const decoder = new TextDecoder();

/** Whether this is OpenZFS (zfs-fuse has no `encryption`, nor receive's -x). */
async function isOpenZfs(pool: TestPool): Promise<boolean> {
  return (await tryRun("zfs", "get", "-H", "-o", "value", "encryption", pool.parent)).code === 0;
}

/** The bytes `zfs send <args>` writes. */
async function send(...args: string[]): Promise<Uint8Array> {
  const out = await new Deno.Command("zfs", {
    args: ["send", ...args],
    stdout: "piped",
    stderr: "piped",
  })
    .output();
  if (!out.success) throw new Error(`zfs send ${args.join(" ")}: ${decoder.decode(out.stderr)}`);
  return out.stdout;
}

/** `zfs receive -u <target>` of `bytes` (the test's own receive, outside the plugin). */
async function receive(target: string, bytes: Uint8Array): Promise<void> {
  const child = new Deno.Command("zfs", {
    args: ["receive", "-u", target],
    stdin: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(bytes);
  await writer.close();
  const out = await child.output();
  if (!out.success) throw new Error(`zfs receive ${target}: ${decoder.decode(out.stderr)}`);
}

/** Every `<name> <property>=<value>` below `root` whose source is `received`. */
async function receivedBelow(root: string): Promise<string[]> {
  const out = await sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-s",
    "received",
    "-o",
    "name,property,value,source",
    "all",
    root,
  );
  return out.split("\n").filter((l) => l.endsWith("\treceived"))
    .map((l) => l.split("\t").slice(0, 3).join(" "));
}

/** Names of the datasets and snapshots below `root`. */
async function namesBelow(root: string): Promise<string[]> {
  const out = await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", root);
  return out.split("\n").filter((l) => l !== "");
}

/** Everything mounted at or below `path` on the host. */
async function mountedAt(path: string): Promise<string[]> {
  return (await hostMounts()).filter((m) => m.path === path || m.path.startsWith(`${path}/`))
    .map((m) => `${m.source} on ${m.path}`);
}

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

function hex(guid: string): string {
  return BigInt(guid).toString(16).padStart(16, "0");
}

function randomHex(bytes: number): string {
  return [...crypto.getRandomValues(new Uint8Array(bytes))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** A snapshot someone made outside the plugin: its stream's bytes and its guid. */
interface Made {
  readonly bytes: Uint8Array;
  readonly guid: string;
  readonly snapshot: string;
}

/**
 * A dataset `name` outside the parent with `props`, a file, a snapshot `snap`, sent with
 * `sendFlags` (`-p` for a stream with properties); the dataset is destroyed again, so that only
 * the stream holds it (and nothing stays mounted where its mountpoint says).
 */
async function madeOutside(
  pool: TestPool,
  name: string,
  props: Readonly<Record<string, string>>,
  snap: string,
  sendFlags: readonly string[],
): Promise<Made> {
  const dataset = `${pool.pool}/${name}`;
  const opts = Object.entries(props).flatMap(([k, v]) => ["-o", `${k}=${v}`]);
  await sh("zfs", "create", ...opts, dataset);
  const mounted = (await sh("zfs", "get", "-H", "-o", "value", "mounted", dataset)).trim();
  if (mounted === "yes") {
    const dir = (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", dataset)).trim();
    await Deno.writeTextFile(`${dir}/from-the-stream.txt`, `written outside the plugin\n`);
  }
  await sh("zfs", "snapshot", `${dataset}@${snap}`);
  const guid = (await sh("zfs", "get", "-Hp", "-o", "value", "guid", `${dataset}@${snap}`)).trim();
  const bytes = await send(...sendFlags, `${dataset}@${snap}`);
  await destroyAll(dataset);
  return { bytes, guid, snapshot: snap };
}

/** `zfs destroy -r`, retried while zfs-fuse calls a dataset just mounted busy. */
async function destroyAll(dataset: string): Promise<void> {
  for (let i = 0;; i++) {
    const r = await tryRun("zfs", "destroy", "-r", dataset);
    if (r.code === 0) return;
    if (i > 20 || !/busy/.test(r.stderr)) throw new Error(`zfs destroy -r ${dataset}: ${r.stderr}`);
    await new Promise((res) => setTimeout(res, 250));
  }
}

/** A manifest of the volume's store record with another snapshot's stream, written as stored. */
async function storeAs(
  store: StoreUnderTest,
  like: SnapshotManifest,
  made: Made,
  over: Partial<SnapshotManifest> = {},
): Promise<SnapshotManifest> {
  const volume = like.volume;
  const m: SnapshotManifest = {
    ...like,
    guid: made.guid,
    baseGuid: null,
    snapshot: made.snapshot,
    csiName: `${made.snapshot}-${randomHex(2)}`,
    kind: "requested",
    stream: `v1/volumes/${volume}/streams/${hex(made.guid)}-${randomHex(4)}.zfs`,
    size: made.bytes.length,
    sha256: sha256(made.bytes),
    raw: false,
    ...over,
  };
  await store.write(m.stream, made.bytes);
  await store.write(
    `v1/volumes/${volume}/snapshots/${hex(m.guid)}.json`,
    new TextEncoder().encode(JSON.stringify(m)),
  );
  return m;
}

/** The stored manifest of a snapshot CreateSnapshot answered, read from the store's files. */
async function manifestOf(store: StoreUnderTest, snapshotId: string): Promise<SnapshotManifest> {
  const [, volume, h] = /^store:([^:]+):([0-9a-f]{16})$/.exec(snapshotId)!;
  const bytes = await store.read(`v1/volumes/${volume}/snapshots/${h}.json`);
  assert.ok(bytes, `the store holds the manifest of ${snapshotId}`);
  return JSON.parse(decoder.decode(bytes)) as SnapshotManifest;
}

/** CreateVolume `name` from stored snapshot `snapshotId`. */
function restoreRequest(name: string, snapshotId: string, parameters: Record<string, string> = {}) {
  return createVolumeRequest(name, {
    parameters,
    volume_content_source: { snapshot: { snapshot_id: snapshotId } },
  });
}

/**
 * What an operator sets on the parent for the host: no setuid programs, no device nodes. A
 * stream that decided `setuid=on` would show against it.
 */
async function hardenParent(pool: TestPool): Promise<void> {
  await sh("zfs", "set", "setuid=off", pool.parent);
  await sh("zfs", "set", "devices=off", pool.parent);
}

/** A plugin with the directory store on `pool`, and a volume `src` stored as snapshot `src-1`. */
async function storedSource(pool: TestPool, store: StoreUnderTest, extraArgs: string[] = []) {
  await hardenParent(pool);
  const plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    ...store.plugin,
    extraArgs: [...store.plugin.extraArgs ?? [], ...extraArgs],
  });
  const src = await plugin.client.controller("CreateVolume", createVolumeRequest("src"));
  const claim = await claimVolume(plugin, src.volume, "alloc-src");
  let hash: string;
  try {
    await Deno.writeTextFile(`${claim.target}/data.txt`, "the source volume's data\n".repeat(1000));
    hash = await treeHash(claim.target);
  } finally {
    await claim.release();
  }
  const snap = await plugin.client.controller("CreateSnapshot", {
    source_volume_id: src.volume.volume_id,
    name: "src-1",
    parameters: {},
  }, SLOW_CALL_MS);
  assert.equal(snap.snapshot.ready_to_use, true);
  const manifest = await manifestOf(store, snap.snapshot.snapshot_id);
  return { plugin, hash, manifest, snapshotId: snap.snapshot.snapshot_id as string };
}

/** What must hold in `pool` after a refused restore of `name`. */
async function nothingLeft(pool: TestPool, name: string, hostPath: string): Promise<void> {
  const left = (await namesBelow(pool.parent)).filter((n) =>
    n === `${pool.parent}/${name}` || n.startsWith(`${pool.parent}/${name}@`) ||
    n.startsWith(`${pool.parent}/.restore-`)
  );
  assert.deepEqual(left, [], `no volume and no .restore-* dataset left for ${name}`);
  assert.deepEqual(await receivedBelow(pool.pool), [], "no dataset keeps a received property");
  assert.deepEqual(await mountedAt(hostPath), [], `nothing mounted at ${hostPath}`);
}

Deno.test("store restore: a zfs send -p stream decides no property and is never mounted where it says", async () => {
  await using pool = await TestPool.create();
  const store = fileStoreUnderTest(`${pool.dir}/store`);
  await Deno.mkdir(`${pool.dir}/store`);
  const openzfs = await isOpenZfs(pool);
  const { plugin, manifest } = await storedSource(pool, store);
  await using _ = plugin;
  // Where the stream wants to be mounted: below the test's directory, never a host path.
  const hostPath = `${pool.dir}/host-path`;
  await Deno.mkdir(hostPath);

  const hostile = await madeOutside(
    pool,
    "hostile",
    {
      mountpoint: hostPath,
      setuid: "on",
      devices: "on",
      exec: "on",
      "other.tool:x": "from-the-stream",
      "org.zfs-csi:staged-at": "1",
    },
    "hostile",
    ["-p"],
  );
  assert.deepEqual(await mountedAt(hostPath), [], "the source is gone: nothing is mounted there");
  const stored = await storeAs(store, manifest, hostile);
  const details = await rejects(
    plugin.client.controller(
      "CreateVolume",
      restoreRequest("restored", `store:src:${hex(stored.guid)}`),
      SLOW_CALL_MS,
    ),
    Code.DATA_LOSS,
    /other\.tool:x="from-the-stream"/,
  );
  print(`  refused (${openzfs ? "OpenZFS" : "zfs-fuse"}): ${details}`);
  assert.match(details, new RegExp(stored.stream));
  // zfs-fuse has no -x: the check after the receive is what finds the mountpoint.
  if (!openzfs) assert.match(details, /mountpoint=/);
  await nothingLeft(pool, "restored", hostPath);

  // Only what the plugin excludes: OpenZFS restores it without any of it; zfs-fuse refuses.
  const excludable = await madeOutside(
    pool,
    "excludable",
    {
      mountpoint: hostPath,
      setuid: "on",
      devices: "on",
      "com.sun:auto-snapshot": "true",
      "org.zfs-csi:staged-at": "1",
    },
    "excludable",
    ["-p"],
  );
  const second = await storeAs(store, manifest, excludable);
  const request = restoreRequest("excluded", `store:src:${hex(second.guid)}`);
  if (!openzfs) {
    await rejects(
      plugin.client.controller("CreateVolume", request, SLOW_CALL_MS),
      Code.DATA_LOSS,
      /mountpoint=.*setuid=|setuid=.*mountpoint=/,
    );
    await nothingLeft(pool, "excluded", hostPath);
    return;
  }
  const res = await plugin.client.controller("CreateVolume", request, SLOW_CALL_MS);
  const dataset = `${pool.parent}/excluded`;
  assert.deepEqual(await receivedBelow(pool.pool), [], "-x left nothing the stream decided");
  assert.equal(await pool.get(dataset, "mountpoint"), `${pool.mountRoot}/nomad/excluded`);
  assert.equal(await pool.get(dataset, "setuid"), "off", "the parent's, not the stream's");
  assert.equal(await pool.get(dataset, "devices"), "off", "the parent's, not the stream's");
  const claim = await claimVolume(plugin, res.volume, "alloc-excluded");
  try {
    assert.equal(
      await Deno.readTextFile(`${claim.target}/from-the-stream.txt`),
      "written outside the plugin\n",
    );
    assert.deepEqual(await mountedAt(hostPath), []);
  } finally {
    await claim.release();
  }
});

Deno.test("store restore: a stream whose snapshot is not the manifest's leaves nothing behind, and the repaired store restores", async () => {
  await using pool = await TestPool.create();
  const store = fileStoreUnderTest(`${pool.dir}/store`);
  await Deno.mkdir(`${pool.dir}/store`);
  const { plugin, manifest, hash, snapshotId } = await storedSource(pool, store);
  await using _ = plugin;
  const manifestKey = `v1/volumes/src/snapshots/${hex(manifest.guid)}.json`;
  const good = {
    stream: await store.read(manifest.stream),
    manifest: await store.read(manifestKey),
  };
  assert.ok(good.stream && good.manifest);

  // Another snapshot of the same name, sent plainly; its bytes replace the stored stream, and
  // the manifest's size and SHA-256 are made to match them: only the guid tells.
  const other = await madeOutside(pool, "other", {}, manifest.snapshot, []);
  await store.write(manifest.stream, other.bytes);
  await store.write(
    manifestKey,
    new TextEncoder().encode(
      JSON.stringify({ ...manifest, size: other.bytes.length, sha256: sha256(other.bytes) }),
    ),
  );
  const request = restoreRequest("copy", snapshotId);
  await rejects(
    plugin.client.controller("CreateVolume", request, SLOW_CALL_MS),
    Code.DATA_LOSS,
    /guid/,
  );
  await nothingLeft(pool, "copy", `${pool.dir}/nowhere`);

  // Repaired: the stored stream and its manifest as the plugin wrote them.
  await store.write(manifest.stream, good.stream);
  await store.write(manifestKey, good.manifest);
  const res = await plugin.client.controller("CreateVolume", request, SLOW_CALL_MS);
  const claim = await claimVolume(plugin, res.volume, "alloc-copy");
  try {
    assert.equal(await treeHash(claim.target), hash, "the source's data");
  } finally {
    await claim.release();
  }
});

/** The guid of the newest snapshot of `dataset`, or undefined. */
async function newestGuid(dataset: string): Promise<string | undefined> {
  const r = await tryRun(
    "zfs",
    "list",
    "-H",
    "-t",
    "snapshot",
    "-o",
    "name",
    "-s",
    "createtxg",
    "-r",
    dataset,
  );
  const newest = r.stdout.trim().split("\n").filter((l) => l.startsWith(`${dataset}@`)).at(-1);
  if (r.code !== 0 || !newest) return undefined;
  return (await sh("zfs", "get", "-Hp", "-o", "value", "guid", newest)).trim();
}

/** Waits until `check` returns true, failing with `what` after `ms`. */
async function until(
  what: string,
  ms: number,
  check: () => Promise<boolean>,
  more: () => string = () => "",
): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`Waited ${ms} ms for ${what}${more()}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

Deno.test("follow: a head moved to a zfs send -p incremental is refused by the standby, a move and a stage", async () => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-stream-props-" });
  const store = fileStoreUnderTest(dir);
  const a = await createNode("node-a");
  const b = await createNode("node-b");
  // C is no standby: it has no copy, so its stage receives the head's chain in full.
  const c = await createNode("node-c");
  const nodes: FollowNode[] = [a, b, c];
  const hostPath = `${dir}/host-path`;
  await Deno.mkdir(hostPath);
  const VOLUME = "fv";
  const onA = `${a.pool.parent}/${VOLUME}`;
  const onB = `${b.pool.parent}/${VOLUME}`;
  const stageFails = async (node: FollowNode, volumeId: string, alloc: string) => {
    const details = await rejects(
      claimVolume(node.plugin!, { volume_id: volumeId, volume_context: {} }, alloc, {
        stageDeadlineMs: STAGE_MS,
      }),
      Code.DATA_LOSS,
      /other\.tool:y="from-the-stream"/,
    ).catch((err: Error) => {
      throw new Error(`${err.message}${logTail(node, 40)}`, { cause: err });
    });
    print(`  ${node.name}'s stage refused: ${details}`);
  };
  const nothingDecided = async () => {
    for (const n of nodes) {
      assert.deepEqual(await receivedBelow(n.pool.pool), [], `${n.name}: nothing received decides`);
    }
    assert.deepEqual(await mountedAt(hostPath), [], `nothing mounted at ${hostPath}`);
  };
  try {
    for (const n of nodes) {
      await hardenParent(n.pool);
      await startPlugin(n, store, ["--lease-ttl", "3s", "--standby-interval", "1s"]);
    }
    const res = await a.plugin!.client.controller(
      "CreateVolume",
      createVolumeRequest(VOLUME, {
        parameters: { follow: "true", backup_interval: "1h", standby_nodes: "node-b" },
      }),
      SLOW_CALL_MS,
    );
    const volumeId: string = res.volume.volume_id;
    const claim = await claimVolume(
      a.plugin!,
      { volume_id: volumeId, volume_context: {} },
      "alloc-1",
      { stageDeadlineMs: STAGE_MS },
    );
    await Deno.writeTextFile(`${claim.target}/data.txt`, "the volume's data\n".repeat(1000));
    await claim.release();
    const head = (await ownerOf(store, VOLUME)).head as string;
    assert.ok(head, "the release stored a head");
    await until(
      "B's standby copy at the head",
      90_000,
      async () => (await newestGuid(onB)) === head,
    );

    // The head's chain received outside the plugin, a hostile incremental made on top of it.
    const manifests: SnapshotManifest[] = [];
    for (const key of await store.keys(`v1/volumes/${VOLUME}/snapshots/`)) {
      manifests.push(JSON.parse(decoder.decode((await store.read(key))!)) as SnapshotManifest);
    }
    const byGuid = new Map(manifests.map((m) => [m.guid, m]));
    const chain: SnapshotManifest[] = [];
    for (let m = byGuid.get(head); m; m = m.baseGuid ? byGuid.get(m.baseGuid) : undefined) {
      chain.unshift(m);
    }
    const scratch = `${a.pool.pool}/scratch`;
    for (const m of chain) await receive(scratch, (await store.read(m.stream))!);
    const top = chain.at(-1)!;
    for (
      const [k, v] of Object.entries({
        mountpoint: hostPath,
        setuid: "on",
        devices: "on",
        "other.tool:y": "from-the-stream",
      })
    ) await sh("zfs", "set", `${k}=${v}`, scratch);
    await sh("zfs", "snapshot", `${scratch}@hostile`);
    const guid = (await sh("zfs", "get", "-Hp", "-o", "value", "guid", `${scratch}@hostile`))
      .trim();
    const bytes = await send("-p", "-i", `@${top.snapshot}`, `${scratch}@hostile`);
    await destroyAll(scratch);
    const stored = await storeAs(store, top, { bytes, guid, snapshot: "hostile" }, {
      baseGuid: top.guid,
      kind: "scheduled",
    });
    const ownerKey = `v1/volumes/${VOLUME}/owner.json`;
    const owner = JSON.parse(decoder.decode((await store.read(ownerKey))!));
    await store.write(ownerKey, new TextEncoder().encode(JSON.stringify({ ...owner, head: guid })));
    print(`  head moved to ${stored.stream}`);

    // B, the standby: its next background receive is that incremental, refused (before issue
    // 21 it was received, and the copy kept what the stream decided). The refusal is logged
    // before what the stream set is overridden; the tick's end after.
    // Under TCG (the OpenZFS VM) one standby tick of zfs commands can take most of a minute.
    await until("B's standby to take the new head", 180_000, () =>
      Promise.resolve(
        b.plugin!.records().some((r) =>
          r.msg === "standby copy could not be brought to the store's head" ||
          (r.msg === "standby copy received" && r.head === guid)
        ),
      ), () => logTail(b, 40));
    await nothingDecided();
    assert.ok(
      b.plugin!.records().some((r) => r.msg === "a stored stream decided properties: refused"),
      `B's standby refused the stream${logTail(b)}`,
    );

    // A move onto A's clean released copy (an incremental receive into it): refused, and the
    // copy put back as it was (the stream cleared its local properties: set back).
    await stageFails(a, volumeId, "alloc-2");
    assert.equal(await newestGuid(onA), top.guid, "A's copy is back at the old head");
    assert.equal(await a.pool.get(onA, "org.zfs-csi:managed"), "yes");
    assert.equal(await a.pool.get(onA, "org.zfs-csi:follow-released"), top.guid);
    assert.equal(await a.pool.get(onA, "readonly"), "on");
    await nothingDecided();

    // A stage on C receives the head's chain in full into a hidden dataset: refused, nothing
    // of it left.
    await stageFails(c, volumeId, "alloc-3");
    assert.deepEqual(
      (await namesBelow(c.pool.parent)).filter((n) => n !== c.pool.parent),
      [],
      `nothing left on C${logTail(c)}`,
    );
    await nothingDecided();

    // B's copy overrode what the stream set when it refused it: received again (B's standby
    // tries each tick, or B's stage), it decides nothing any more and is used like any stream,
    // mounted where the plugin mounts volumes, with the parent's setuid and devices.
    const onBClaim = await claimVolume(
      b.plugin!,
      { volume_id: volumeId, volume_context: {} },
      "alloc-4",
      { stageDeadlineMs: STAGE_MS },
    );
    try {
      assert.equal(await newestGuid(onB), guid, "B's copy holds the stream's snapshot");
      assert.equal(await b.pool.get(onB, "mountpoint"), `${b.pool.mountRoot}/nomad/${VOLUME}`);
      assert.equal(await b.pool.get(onB, "setuid"), "off");
      assert.equal(await b.pool.get(onB, "devices"), "off");
      assert.equal(await b.pool.get(onB, "other.tool:y"), "-");
      await nothingDecided();
    } finally {
      await onBClaim.release();
    }
  } finally {
    for (const n of nodes) await n.plugin?.stop().catch(() => {});
    for (const n of nodes) await n.pool.destroy().catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

Deno.test("store restore (OpenZFS): a raw zfs send -w -p stream's keylocation never says where the key is read from", async () => {
  await using pool = await TestPool.create();
  if (!(await isOpenZfs(pool))) {
    print("  skipped: this ZFS has no encryption (zfs-fuse); the VM run shows it on OpenZFS");
    return;
  }
  // What OpenZFS says to the plugin's probe of receive's -x (zfs.ts receiveOverrides).
  const probe = await new Deno.Command("zfs", {
    args: ["receive", "-n", "-u", "-x", "mountpoint", `${pool.parent}/probe`],
    stdin: "null",
    stderr: "piped",
  }).output();
  print(`  probe: exit ${probe.code}: ${decoder.decode(probe.stderr).trim()}`);
  const keyDir = `${pool.dir}/keys`;
  await Deno.mkdir(keyDir);
  const key = randomHex(32);
  // The operator's key file, below --key-dir, and the one the stream names, elsewhere.
  await Deno.writeTextFile(`${keyDir}/op.key`, key);
  await Deno.writeTextFile(`${pool.dir}/stream.key`, key);
  const store = fileStoreUnderTest(`${pool.dir}/store`);
  await Deno.mkdir(`${pool.dir}/store`);
  const { plugin, manifest } = await storedSource(pool, store, ["--key-dir", keyDir]);
  await using _ = plugin;
  const hostPath = `${pool.dir}/host-path`;
  await Deno.mkdir(hostPath);
  const made = await madeOutside(
    pool,
    "enc",
    {
      encryption: "on",
      keyformat: "hex",
      keylocation: `file://${pool.dir}/stream.key`,
      mountpoint: hostPath,
      setuid: "on",
    },
    "enc",
    ["-w", "-p"],
  );
  const stored = await storeAs(store, manifest, made, { raw: true });
  // Were the stream's keylocation used, the key could not be loaded any more.
  await Deno.remove(`${pool.dir}/stream.key`);
  const keylocation = `file://${keyDir}/op.key`;
  const request = restoreRequest("enc-copy", `store:src:${hex(stored.guid)}`, { keylocation });
  const dataset = `${pool.parent}/enc-copy`;
  let res;
  try {
    res = await plugin.client.controller("CreateVolume", request, SLOW_CALL_MS);
  } catch (err) {
    // Refused: then for a property of the raw stream the plugin does not set itself.
    const e = err as { code: number; details: string };
    print(`  raw -w -p stream refused: ${e.code} ${e.details}`);
    assert.equal(e.code, Code.DATA_LOSS, e.details);
    await nothingLeft(pool, "enc-copy", hostPath);
    return;
  }
  const keyProps = await sh(
    "zfs",
    "get",
    "-Hp",
    "-o",
    "property,value,received,source",
    "keylocation,keyformat,encryption,pbkdf2iters,encryptionroot,mountpoint,setuid",
    dataset,
  );
  print(`  raw -w -p stream restored:\n${keyProps}`);
  assert.deepEqual(await receivedBelow(pool.pool), [], "nothing the stream decided");
  assert.equal(await pool.get(dataset, "keylocation"), keylocation, "the operator's");
  const claim = await claimVolume(plugin, res.volume, "alloc-enc", { stageDeadlineMs: STAGE_MS });
  try {
    assert.equal(await pool.get(dataset, "keystatus"), "available", "loaded from the operator's");
    assert.equal(
      await Deno.readTextFile(`${claim.target}/from-the-stream.txt`),
      "written outside the plugin\n",
    );
    assert.deepEqual(await mountedAt(hostPath), []);
  } finally {
    await claim.release();
  }
});
