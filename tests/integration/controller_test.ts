/**
 * The Controller service on a real ZFS pool, through the plugin's own process and socket:
 * every RPC called twice (a repeat answers as the first did), pagination, error codes, data
 * carried by snapshots and clones, growth, soft delete and its purge, and calls about another
 * node's volumes refused without touching anything.
 *
 * zfs-fuse cannot show: encryption and other OpenZFS-only properties being accepted (here
 * they are refused, as on any ZFS without them; the argv is unit-tested in
 * src/csi/controller_test.ts), and `zfs destroy -d` racing a clone on OpenZFS's kernel module.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { PLUGIN_NAME } from "../../src/version.ts";
import { codeOf, type CsiClient, rejects } from "../support/csi_client.ts";
import { claimPaths, claimVolume, createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { poolState, sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
const NODE_KEY = `${PLUGIN_NAME}/node`;

async function sha256(path: string): Promise<string> {
  const data = await Deno.readFile(path);
  const digest = await crypto.subtle.digest("SHA-256", data);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function randomBytes(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i += 65536) crypto.getRandomValues(out.subarray(i, i + 65536));
  return out;
}

async function listAll(
  c: CsiClient,
  method: "ListVolumes" | "ListSnapshots",
  req: Record<string, unknown>,
  pageSize: number,
): Promise<string[]> {
  const ids: string[] = [];
  let token = "";
  for (let i = 0; i < 100; i++) {
    const res = await c.controller(method, {
      ...req,
      max_entries: pageSize,
      starting_token: token,
    });
    assert.ok(res.entries.length <= pageSize, "a page holds at most max_entries");
    for (const e of res.entries) ids.push(e.volume?.volume_id ?? e.snapshot?.snapshot_id);
    token = res.next_token;
    if (token === "") return ids;
  }
  assert.fail("pagination did not end");
}

Deno.test("controller: create, snapshot, clone, grow and delete on a real pool", async (t) => {
  await using pool = await TestPool.create(1024);
  let plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId: "node-a",
    topology: ["zone=eu1"],
  });
  const c = () => plugin.client;
  const topology = { zone: "eu1", [NODE_KEY]: "node-a" };

  try {
    await t.step(
      "capabilities: controller service with create, snapshot, clone, expand",
      async () => {
        const caps = await c().identity("GetPluginCapabilities");
        const services = caps.capabilities.map((x: { service: { type: string } }) =>
          x.service.type
        );
        assert.deepEqual(services.sort(), [
          "CONTROLLER_SERVICE",
          "VOLUME_ACCESSIBILITY_CONSTRAINTS",
        ]);
        const ctrl = await c().controller("ControllerGetCapabilities");
        const rpcs = ctrl.capabilities.map((x: { rpc: { type: string } }) => x.rpc.type).sort();
        assert.deepEqual(rpcs, [
          "CLONE_VOLUME",
          "CREATE_DELETE_SNAPSHOT",
          "CREATE_DELETE_VOLUME",
          "EXPAND_VOLUME",
          "GET_CAPACITY",
          "GET_VOLUME",
          "LIST_SNAPSHOTS",
          "LIST_VOLUMES",
          "VOLUME_CONDITION",
        ]);
        assert.ok(!rpcs.includes("PUBLISH_UNPUBLISH_VOLUME"));
      },
    );

    let pg: { volume_id: string; volume_context: Record<string, string> };
    await t.step(
      "CreateVolume makes a quota'd dataset pinned to this node; a repeat is the same",
      async () => {
        const req = createVolumeRequest("pg", {
          parameters: { compression: "on", recordsize: "16K", "com.example:team": "db" },
        });
        const first = await c().controller("CreateVolume", req);
        const second = await c().controller("CreateVolume", req);
        assert.deepEqual(second, first);
        pg = first.volume;
        assert.equal(pg.volume_id, "pg@node-a");
        assert.equal(Number(first.volume.capacity_bytes), 64 * MiB);
        assert.deepEqual(pg.volume_context, { dataset: `${pool.parent}/pg` });
        assert.deepEqual(first.volume.accessible_topology, [{ segments: topology }]);
        const ds = `${pool.parent}/pg`;
        assert.equal(await pool.get(ds, "refquota"), String(64 * MiB));
        assert.equal(await pool.get(ds, "quota"), "0");
        assert.equal(await pool.get(ds, "compression"), "on");
        assert.equal(await pool.get(ds, "recordsize"), "16384");
        assert.equal(await pool.get(ds, "com.example:team"), "db");
        assert.equal(await pool.get(ds, "org.zfs-csi:managed"), "yes");
      },
    );

    await t.step("CreateVolume repeats that do not fit the volume are ALREADY_EXISTS", async () => {
      const before = await poolState(pool);
      const other = [
        createVolumeRequest("pg", { parameters: { compression: "off" } }),
        createVolumeRequest("pg", {
          parameters: { compression: "on", recordsize: "16K", "com.example:team": "db" },
          capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
        }),
        createVolumeRequest("pg", {
          parameters: { compression: "on", recordsize: "16K", "com.example:team": "db" },
          capacity_range: { required_bytes: "0", limit_bytes: String(32 * MiB) },
        }),
      ];
      for (const req of other) {
        await rejects(c().controller("CreateVolume", req), Code.ALREADY_EXISTS);
      }
      // A range the volume fits, and no range at all, are compatible.
      const fits = await c().controller(
        "CreateVolume",
        createVolumeRequest("pg", {
          parameters: { compression: "on", recordsize: "16K", "com.example:team": "db" },
          capacity_range: { required_bytes: String(32 * MiB), limit_bytes: String(100 * MiB) },
        }),
      );
      assert.equal(fits.volume.volume_id, "pg@node-a");
      const nil = await c().controller(
        "CreateVolume",
        createVolumeRequest("pg", {
          parameters: { compression: "on", recordsize: "16K", "com.example:team": "db" },
          capacity_range: null,
        }),
      );
      assert.equal(Number(nil.volume.capacity_bytes), 64 * MiB);
      assert.equal(await poolState(pool), before);
    });

    await t.step("CreateVolume without a capacity range makes an unlimited volume", async () => {
      const res = await c().controller(
        "CreateVolume",
        createVolumeRequest("free", { capacity_range: null }),
      );
      assert.equal(Number(res.volume.capacity_bytes), 0);
      assert.equal(await pool.get(`${pool.parent}/free`, "refquota"), "0");
      const again = await c().controller(
        "CreateVolume",
        createVolumeRequest("free", { capacity_range: null }),
      );
      assert.deepEqual(again, res);
    });

    await t.step("quota=capacity bounds data and snapshots together; a size sets it", async () => {
      const a = await c().controller(
        "CreateVolume",
        createVolumeRequest("bounded", {
          capacity_range: { required_bytes: String(32 * MiB), limit_bytes: "0" },
          parameters: { quota: "capacity" },
        }),
      );
      assert.equal(Number(a.volume.capacity_bytes), 32 * MiB);
      assert.equal(await pool.get(`${pool.parent}/bounded`, "quota"), String(32 * MiB));
      await c().controller(
        "CreateVolume",
        createVolumeRequest("headroom", {
          capacity_range: { required_bytes: String(32 * MiB), limit_bytes: "0" },
          parameters: { quota: "48MiB" },
        }),
      );
      assert.equal(await pool.get(`${pool.parent}/headroom`, "quota"), String(48 * MiB));
    });

    await t.step(
      "CreateVolume refuses bad input with clear codes and changes nothing",
      async (s) => {
        const before = await poolState(pool);
        const openzfs = (await tryRun("zfs", "get", "-H", "-o", "value", "relatime", pool.parent))
          .code === 0;
        const block = { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } };
        const cases: Array<[string, Record<string, unknown>, number, RegExp?]> = [
          ["no name", createVolumeRequest(""), Code.INVALID_ARGUMENT],
          ["name with /", createVolumeRequest("a/b"), Code.INVALID_ARGUMENT],
          ["name with @", createVolumeRequest("a@node-a"), Code.INVALID_ARGUMENT],
          ["name with ..", createVolumeRequest("..x"), Code.INVALID_ARGUMENT],
          [
            "no capabilities",
            createVolumeRequest("x", { volume_capabilities: [] }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "block",
            createVolumeRequest("x", { volume_capabilities: [block] }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "mountpoint parameter",
            createVolumeRequest("x", { parameters: { mountpoint: "/etc" } }),
            Code.INVALID_ARGUMENT,
            /not supported/,
          ],
          [
            "sharenfs",
            createVolumeRequest("x", { parameters: { sharenfs: "on" } }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "option in a value",
            createVolumeRequest("x", { parameters: { compression: "lz4 -o mountpoint=/etc" } }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "our own property",
            createVolumeRequest("x", { parameters: { "org.zfs-csi:managed": "no" } }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "a key format without a key location (no terminal to prompt on)",
            createVolumeRequest("x", { parameters: { encryption: "on", keyformat: "passphrase" } }),
            Code.INVALID_ARGUMENT,
            /needs "keylocation"/,
          ],
          // zfs-fuse knows no relatime; OpenZFS does, and refuses a value it does not know.
          openzfs
            ? [
              "a value OpenZFS refuses",
              createVolumeRequest("x", {
                parameters: { relatime: "on", dnodesize: "legacy", copies: "3", recordsize: "3K" },
              }),
              Code.INVALID_ARGUMENT,
              /recordsize/,
            ]
            : [
              "an OpenZFS-only property on zfs-fuse",
              createVolumeRequest("x", { parameters: { relatime: "on" } }),
              Code.INVALID_ARGUMENT,
              /needs OpenZFS/,
            ],
          [
            "negative size",
            createVolumeRequest("x", {
              capacity_range: { required_bytes: "-1", limit_bytes: "0" },
            }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "required above limit",
            createVolumeRequest("x", {
              capacity_range: { required_bytes: String(64 * MiB), limit_bytes: String(32 * MiB) },
            }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "limit below the smallest volume",
            createVolumeRequest("x", {
              capacity_range: { required_bytes: "1", limit_bytes: "1000" },
            }),
            Code.OUT_OF_RANGE,
          ],
          [
            "quota below capacity",
            createVolumeRequest("x", { parameters: { quota: "1MiB" } }),
            Code.INVALID_ARGUMENT,
          ],
          [
            "requisite topology of another node",
            createVolumeRequest("x", {
              accessibility_requirements: {
                requisite: [{ segments: { [NODE_KEY]: "node-b" } }],
                preferred: [],
              },
            }),
            Code.RESOURCE_EXHAUSTED,
            /node-a/,
          ],
          [
            "snapshot source that does not exist",
            createVolumeRequest("x", {
              volume_content_source: { snapshot: { snapshot_id: "pg@nothing@node-a" } },
            }),
            Code.NOT_FOUND,
          ],
          [
            "malformed snapshot source",
            createVolumeRequest("x", {
              volume_content_source: { snapshot: { snapshot_id: "not-a-snapshot-id" } },
            }),
            Code.NOT_FOUND,
          ],
          [
            "volume source that does not exist",
            createVolumeRequest("x", {
              volume_content_source: { volume: { volume_id: "nothing@node-a" } },
            }),
            Code.NOT_FOUND,
          ],
        ];
        for (const [what, req, code, message] of cases) {
          await s.step(what, async () => {
            await rejects(c().controller("CreateVolume", req), code, message);
          });
        }
        // A requisite that names this node is honoured.
        const ok = await c().controller(
          "CreateVolume",
          createVolumeRequest("placed", {
            accessibility_requirements: {
              requisite: [{ segments: { [NODE_KEY]: "node-b" } }, {
                segments: { [NODE_KEY]: "node-a" },
              }],
              preferred: [],
            },
          }),
        );
        assert.equal(ok.volume.volume_id, "placed@node-a");
        await c().controller("DeleteVolume", { volume_id: "placed@node-a" });
        assert.equal(
          (await poolState(pool)).replace(
            new RegExp(`^.*${pool.parent}/\\.deleted-.*$\n?`, "gm"),
            "",
          ),
          before,
          "nothing changed but the deleted volume set aside",
        );
      },
    );

    await t.step(
      "a created volume goes through Nomad's node calls and keeps its data",
      async () => {
        const a = await claimVolume(plugin, pg, "alloc-1");
        await Deno.writeTextFile(`${a.target}/hello.txt`, "hello");
        await a.release();
        const b = await claimVolume(plugin, pg, "alloc-2");
        assert.equal(await Deno.readTextFile(`${b.target}/hello.txt`), "hello");
        await b.release();
      },
    );

    await t.step(
      "DeleteVolume of a staged volume is FAILED_PRECONDITION and keeps it",
      async () => {
        const a = await claimVolume(plugin, pg, "alloc-3");
        await rejects(
          c().controller("DeleteVolume", { volume_id: pg.volume_id }),
          Code.FAILED_PRECONDITION,
          /in use/,
        );
        assert.equal(await pool.get(`${pool.parent}/pg`, "type"), "filesystem");
        await a.release();
      },
    );

    let snapshotSum = "";
    let snapshotId = "";
    await t.step(
      "CreateSnapshot is idempotent on name; names are unique across volumes",
      async () => {
        const a = await claimVolume(plugin, pg, "alloc-4");
        await Deno.writeFile(`${a.target}/data.bin`, randomBytes(4 * MiB));
        snapshotSum = await sha256(`${a.target}/data.bin`);
        const req = { source_volume_id: pg.volume_id, name: "nightly", parameters: {} };
        const first = await c().controller("CreateSnapshot", req);
        const second = await c().controller("CreateSnapshot", req);
        assert.deepEqual(second, first);
        snapshotId = first.snapshot.snapshot_id;
        assert.equal(snapshotId, "pg@nightly@node-a");
        assert.equal(first.snapshot.source_volume_id, "pg@node-a");
        assert.equal(first.snapshot.ready_to_use, true);
        assert.ok(Number(first.snapshot.size_bytes) >= 4 * MiB);
        assert.ok(Number(first.snapshot.creation_time.seconds) > 1_600_000_000);
        assert.equal(await pool.get(`${pool.parent}/pg@nightly`, "type"), "snapshot");
        await rejects(
          c().controller("CreateSnapshot", { source_volume_id: "free@node-a", name: "nightly" }),
          Code.ALREADY_EXISTS,
        );
        await rejects(
          c().controller("CreateSnapshot", { source_volume_id: "nothing@node-a", name: "x" }),
          Code.NOT_FOUND,
        );
        await rejects(
          c().controller("CreateSnapshot", { source_volume_id: pg.volume_id, name: "" }),
          Code.INVALID_ARGUMENT,
        );
        await rejects(
          c().controller("CreateSnapshot", { source_volume_id: pg.volume_id, name: "a@b" }),
          Code.INVALID_ARGUMENT,
        );
        await rejects(
          c().controller("CreateSnapshot", {
            source_volume_id: pg.volume_id,
            name: "x",
            parameters: { foo: "bar" },
          }),
          Code.INVALID_ARGUMENT,
        );
        // Change the volume after the snapshot: the restore below must not see this.
        await Deno.writeFile(`${a.target}/data.bin`, randomBytes(4 * MiB));
        assert.notEqual(await sha256(`${a.target}/data.bin`), snapshotSum);
        await a.release();
      },
    );

    await t.step("DeleteVolume of a volume with snapshots is FAILED_PRECONDITION", async () => {
      await rejects(
        c().controller("DeleteVolume", { volume_id: pg.volume_id }),
        Code.FAILED_PRECONDITION,
        /has snapshots.*pg@nightly@node-a/,
      );
    });

    let restored: { volume_id: string; volume_context: Record<string, string> };
    await t.step("a volume created from a snapshot holds the snapshot's bytes", async () => {
      const req = createVolumeRequest("restored", {
        volume_content_source: { snapshot: { snapshot_id: snapshotId } },
      });
      const first = await c().controller("CreateVolume", req);
      assert.deepEqual(await c().controller("CreateVolume", req), first);
      restored = first.volume;
      assert.deepEqual(first.volume.content_source.snapshot, { snapshot_id: snapshotId });
      assert.equal(
        await pool.get(`${pool.parent}/restored`, "origin"),
        `${pool.parent}/pg@nightly`,
      );
      const a = await claimVolume(plugin, restored, "alloc-5");
      assert.equal(await sha256(`${a.target}/data.bin`), snapshotSum);
      await a.release();
      // Same name, another source: not the same volume.
      await rejects(
        c().controller(
          "CreateVolume",
          createVolumeRequest("restored", {
            volume_content_source: { volume: { volume_id: pg.volume_id } },
          }),
        ),
        Code.ALREADY_EXISTS,
      );
      // Smaller than the data it would hold.
      await rejects(
        c().controller(
          "CreateVolume",
          createVolumeRequest("too-small", {
            capacity_range: { required_bytes: String(2 * MiB), limit_bytes: "0" },
            volume_content_source: { snapshot: { snapshot_id: snapshotId } },
          }),
        ),
        Code.OUT_OF_RANGE,
      );
    });

    let copy: { volume_id: string; volume_context: Record<string, string> };
    let currentSum = "";
    await t.step("a volume cloned from a volume holds its current bytes", async () => {
      const a = await claimVolume(plugin, pg, "alloc-6");
      currentSum = await sha256(`${a.target}/data.bin`);
      await a.release();
      const req = createVolumeRequest("copy", {
        volume_content_source: { volume: { volume_id: pg.volume_id } },
      });
      const first = await c().controller("CreateVolume", req);
      assert.deepEqual(await c().controller("CreateVolume", req), first);
      copy = first.volume;
      const b = await claimVolume(plugin, copy, "alloc-7");
      assert.equal(await sha256(`${b.target}/data.bin`), currentSum);
      await b.release();
      // The clone's hidden snapshot is no CSI snapshot.
      const list = await c().controller("ListSnapshots", { source_volume_id: pg.volume_id });
      assert.deepEqual(
        list.entries.map((e: { snapshot: { snapshot_id: string } }) => e.snapshot.snapshot_id),
        [snapshotId],
      );
    });

    await t.step("ListSnapshots filters by snapshot id and source volume", async () => {
      const byId = await c().controller("ListSnapshots", { snapshot_id: snapshotId });
      assert.equal(byId.entries.length, 1);
      assert.equal(byId.entries[0].snapshot.source_volume_id, "pg@node-a");
      for (const bad of ["none-exist-id", "pg@none@node-a", "x@y@node-b"]) {
        const res = await c().controller("ListSnapshots", { snapshot_id: bad });
        assert.deepEqual(res.entries, [], bad);
      }
      const none = await c().controller("ListSnapshots", { source_volume_id: "nothing" });
      assert.deepEqual(none.entries, []);
    });

    await t.step(
      "DeleteSnapshot with a dependent clone keeps the clone's data; repeats are OK",
      async () => {
        await c().controller("DeleteSnapshot", { snapshot_id: snapshotId });
        await c().controller("DeleteSnapshot", { snapshot_id: snapshotId });
        await c().controller("DeleteSnapshot", { snapshot_id: "reallyfakesnapshotid" });
        const list = await c().controller("ListSnapshots", {});
        assert.ok(
          !list.entries.some((e: { snapshot: { snapshot_id: string } }) =>
            e.snapshot.snapshot_id === snapshotId
          ),
        );
        const a = await claimVolume(plugin, restored, "alloc-8");
        assert.equal(await sha256(`${a.target}/data.bin`), snapshotSum);
        await a.release();
        // Set aside, not destroyed: a rename undoes it.
        const snaps = await sh(
          "zfs",
          "list",
          "-H",
          "-o",
          "name",
          "-t",
          "snapshot",
          "-r",
          `${pool.parent}/pg`,
        );
        assert.match(snaps, /pg@\.deleted-\d+-nightly/);
      },
    );

    await t.step("ListVolumes and ListSnapshots page with max_entries and tokens", async () => {
      for (const n of ["v1", "v2", "v3", "v4", "v5"]) {
        await c().controller("CreateVolume", createVolumeRequest(n, { capacity_range: null }));
        await c().controller("CreateSnapshot", { source_volume_id: `${n}@node-a`, name: `s-${n}` });
      }
      const all = await c().controller("ListVolumes", {});
      const ids = all.entries.map((e: { volume: { volume_id: string } }) => e.volume.volume_id);
      assert.equal(all.next_token, "");
      for (
        const want of ["pg@node-a", "free@node-a", "restored@node-a", "copy@node-a", "v5@node-a"]
      ) {
        assert.ok(ids.includes(want), want);
      }
      assert.ok(!ids.some((i: string) => i.includes(".deleted")));
      for (const size of [1, 2, 3, 7]) {
        assert.deepEqual(await listAll(c(), "ListVolumes", {}, size), ids, `page size ${size}`);
      }
      // A token outlives the deletion of the last entry its page returned.
      const first = await c().controller("ListVolumes", { max_entries: 1 });
      assert.equal(first.entries[0].volume.volume_id, ids[0]);
      assert.equal(ids[0], "bounded@node-a");
      await c().controller("DeleteVolume", { volume_id: ids[0] });
      const rest = await c().controller("ListVolumes", { starting_token: first.next_token });
      assert.deepEqual(
        rest.entries.map((e: { volume: { volume_id: string } }) => e.volume.volume_id),
        ids.slice(1),
      );
      await rejects(
        c().controller("ListVolumes", { starting_token: "invalid-token" }),
        Code.ABORTED,
      );
      await rejects(c().controller("ListSnapshots", { starting_token: "after:!!" }), Code.ABORTED);
      const snaps = await c().controller("ListSnapshots", {});
      const snapIds = snaps.entries.map((e: { snapshot: { snapshot_id: string } }) =>
        e.snapshot.snapshot_id
      );
      assert.ok(snapIds.length >= 4);
      assert.deepEqual(await listAll(c(), "ListSnapshots", {}, 2), snapIds);
      const page = await c().controller("ListSnapshots", { max_entries: 2 });
      await c().controller("DeleteSnapshot", { snapshot_id: page.entries[1].snapshot.snapshot_id });
      const after = await c().controller("ListSnapshots", { starting_token: page.next_token });
      assert.deepEqual(
        after.entries.map((e: { snapshot: { snapshot_id: string } }) => e.snapshot.snapshot_id),
        snapIds.slice(2),
      );
    });

    await t.step(
      "ControllerExpandVolume grows the quota; writes past the old size then fit",
      async () => {
        const small = (await c().controller(
          "CreateVolume",
          createVolumeRequest("grow", {
            capacity_range: { required_bytes: String(8 * MiB), limit_bytes: "0" },
            parameters: { quota: "capacity" },
          }),
        )).volume;
        const a = await claimVolume(plugin, small, "alloc-9");
        await Deno.writeFile(`${a.target}/a.bin`, randomBytes(5 * MiB));
        await assert.rejects(Deno.writeFile(`${a.target}/b.bin`, randomBytes(6 * MiB)));
        await Deno.remove(`${a.target}/b.bin`).catch(() => {});
        const req = {
          volume_id: small.volume_id,
          capacity_range: { required_bytes: String(32 * MiB), limit_bytes: "0" },
          volume_capability: null,
        };
        const first = await c().controller("ControllerExpandVolume", req);
        assert.deepEqual(await c().controller("ControllerExpandVolume", req), first);
        assert.equal(Number(first.capacity_bytes), 32 * MiB);
        assert.equal(first.node_expansion_required, false);
        assert.equal(await pool.get(`${pool.parent}/grow`, "refquota"), String(32 * MiB));
        assert.equal(await pool.get(`${pool.parent}/grow`, "quota"), String(32 * MiB));
        await Deno.writeFile(`${a.target}/b.bin`, randomBytes(12 * MiB));
        await a.release();
        // Never shrink; a smaller request leaves it as it is.
        await rejects(
          c().controller("ControllerExpandVolume", {
            volume_id: small.volume_id,
            capacity_range: { required_bytes: String(8 * MiB), limit_bytes: String(16 * MiB) },
          }),
          Code.OUT_OF_RANGE,
        );
        const same = await c().controller("ControllerExpandVolume", {
          volume_id: small.volume_id,
          capacity_range: { required_bytes: String(8 * MiB), limit_bytes: "0" },
        });
        assert.equal(Number(same.capacity_bytes), 32 * MiB);
        await rejects(
          c().controller("ControllerExpandVolume", { volume_id: small.volume_id }),
          Code.INVALID_ARGUMENT,
        );
        await rejects(
          c().controller("ControllerExpandVolume", {
            volume_id: "nothing@node-a",
            capacity_range: { required_bytes: String(8 * MiB), limit_bytes: "0" },
          }),
          Code.NOT_FOUND,
        );
      },
    );

    await t.step("ValidateVolumeCapabilities, ControllerGetVolume and GetCapacity", async () => {
      const validate = {
        volume_id: pg.volume_id,
        volume_capabilities: [mountCapability()],
        volume_context: pg.volume_context,
        parameters: { compression: "on" },
      };
      const ok = await c().controller("ValidateVolumeCapabilities", validate);
      assert.deepEqual(await c().controller("ValidateVolumeCapabilities", validate), ok);
      assert.equal(ok.confirmed.volume_capabilities.length, 1);
      assert.equal(ok.confirmed.volume_capabilities[0].access_mode.mode, "SINGLE_NODE_WRITER");
      assert.deepEqual(ok.confirmed.volume_context, pg.volume_context);
      const block = await c().controller("ValidateVolumeCapabilities", {
        volume_id: pg.volume_id,
        volume_capabilities: [{ block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } }],
      });
      assert.equal(block.confirmed, null);
      assert.match(block.message, /Block/);
      await rejects(
        c().controller("ValidateVolumeCapabilities", {
          volume_id: "nothing@node-a",
          volume_capabilities: [mountCapability()],
        }),
        Code.NOT_FOUND,
      );
      await rejects(
        c().controller("ValidateVolumeCapabilities", {
          volume_id: pg.volume_id,
          volume_capabilities: [],
        }),
        Code.INVALID_ARGUMENT,
      );
      const got = await c().controller("ControllerGetVolume", { volume_id: pg.volume_id });
      assert.deepEqual(
        await c().controller("ControllerGetVolume", { volume_id: pg.volume_id }),
        got,
      );
      assert.equal(got.volume.volume_id, "pg@node-a");
      assert.equal(got.status.volume_condition.abnormal, false);
      await rejects(
        c().controller("ControllerGetVolume", { volume_id: "nothing" }),
        Code.NOT_FOUND,
      );
      const cap = await c().controller("GetCapacity", {});
      assert.equal(Number(cap.minimum_volume_size.value), MiB);
      assert.ok(Number(cap.maximum_volume_size.value) > 0);
      const available = Number(await pool.get(pool.parent, "available"));
      assert.ok(Math.abs(Number(cap.available_capacity) - available) < 16 * MiB);
      const elsewhere = await c().controller("GetCapacity", {
        accessible_topology: { segments: { [NODE_KEY]: "node-b" } },
      });
      assert.equal(Number(elsewhere.available_capacity), 0);
    });

    await t.step("calls about another node's volumes are refused and touch nothing", async (s) => {
      const before = await poolState(pool);
      const calls: Array<[string, () => Promise<unknown>]> = [
        ["DeleteVolume", () => c().controller("DeleteVolume", { volume_id: "pg@node-b" })],
        [
          "ControllerExpandVolume",
          () =>
            c().controller("ControllerExpandVolume", {
              volume_id: "pg@node-b",
              capacity_range: { required_bytes: String(128 * MiB) },
            }),
        ],
        [
          "CreateSnapshot",
          () => c().controller("CreateSnapshot", { source_volume_id: "pg@node-b", name: "z" }),
        ],
        [
          "DeleteSnapshot",
          () => c().controller("DeleteSnapshot", { snapshot_id: "pg@nightly@node-b" }),
        ],
        [
          "ValidateVolumeCapabilities",
          () =>
            c().controller("ValidateVolumeCapabilities", {
              volume_id: "pg@node-b",
              volume_capabilities: [mountCapability()],
            }),
        ],
        [
          "CreateVolume from it",
          () =>
            c().controller(
              "CreateVolume",
              createVolumeRequest("y", {
                volume_content_source: { volume: { volume_id: "pg@node-b" } },
              }),
            ),
        ],
      ];
      for (const [what, call] of calls) {
        await s.step(
          what,
          async () => {
            await rejects(call(), Code.FAILED_PRECONDITION, /lives on node "node-b"/);
          },
        );
      }
      const p = await claimPaths(plugin.baseDir, { volumeId: "pg@node-b", allocId: "alloc-x" });
      await rejects(
        c().node("NodeStageVolume", {
          volume_id: "pg@node-b",
          staging_target_path: p.staging,
          volume_capability: mountCapability(),
          volume_context: { size: "1GiB" },
        }),
        Code.FAILED_PRECONDITION,
      );
      assert.equal(await poolState(pool), before);
    });

    await t.step(
      "DeleteVolume sets the dataset aside; a rename undoes it; repeats are OK",
      async () => {
        await c().controller("DeleteVolume", { volume_id: "free@node-a" });
        await c().controller("DeleteVolume", { volume_id: "free@node-a" });
        // A missing volume, named with its node (a node-less id is refused: tenancy_test.ts).
        await c().controller("DeleteVolume", { volume_id: "fake-vol-id@node-a" });
        const names = await pool.datasets();
        assert.ok(!names.includes(`${pool.parent}/free`));
        const hidden = names.find((n) => /\/\.deleted-\d+-free$/.test(n));
        assert.ok(hidden, `a .deleted-*-free dataset in ${names.join(", ")}`);
        assert.equal(await pool.get(hidden, "mounted"), "no");
        assert.equal(await pool.get(hidden, "canmount"), "noauto");
        const listed = await listAll(c(), "ListVolumes", {}, 100);
        assert.ok(!listed.includes("free@node-a"));
        // The documented undo.
        await sh("zfs", "rename", hidden, `${pool.parent}/free`);
        await sh("zfs", "set", "canmount=on", `${pool.parent}/free`);
        assert.ok((await listAll(c(), "ListVolumes", {}, 100)).includes("free@node-a"));
        await c().controller("DeleteVolume", { volume_id: "free@node-a" });
      },
    );

    await t.step("deleting a clone's source volume leaves the clone whole", async () => {
      await c().controller("DeleteVolume", { volume_id: pg.volume_id });
      const b = await claimVolume(plugin, copy, "alloc-10");
      assert.equal(await sha256(`${b.target}/data.bin`), currentSum);
      await b.release();
    });

    await t.step("a foreign dataset is never deleted", async () => {
      await sh("zfs", "create", `${pool.parent}/foreign`);
      await rejects(
        c().controller("DeleteVolume", { volume_id: "foreign@node-a" }),
        Code.FAILED_PRECONDITION,
        /not managed/,
      );
      await rejects(
        c().controller("CreateVolume", createVolumeRequest("foreign")),
        Code.ALREADY_EXISTS,
        /not manage/,
      );
      assert.equal(await pool.get(`${pool.parent}/foreign`, "type"), "filesystem");
    });

    await t.step(
      "with retention 0, deletes destroy at once and the purge empties the trash",
      async () => {
        await plugin.stop();
        plugin = await PluginProcess.start({
          parentDataset: pool.parent,
          dir: pool.dir,
          nodeId: "node-a",
          topology: ["zone=eu1"],
          extraArgs: ["--deleted-retention", "0"],
        });
        await c().controller("DeleteVolume", { volume_id: "headroom@node-a" });
        const deadline = Date.now() + 15_000;
        let names = await pool.datasets();
        // The start-up purge destroys what was set aside, except the source the clone needs.
        while (Date.now() < deadline && names.filter((n) => n.includes(".deleted-")).length > 1) {
          await new Promise((r) => setTimeout(r, 200));
          names = await pool.datasets();
        }
        assert.ok(
          !names.some((n) => n.endsWith("/headroom") || n.includes("-headroom")),
          names.join(),
        );
        assert.deepEqual(
          names.filter((n) => n.includes(".deleted-")).map((n) =>
            n.replace(/\.deleted-\d+-/, ".deleted-*-")
          ),
          [`${pool.parent}/.deleted-*-pg`],
        );
        // Once the clone goes, its source goes too.
        await c().controller("DeleteVolume", { volume_id: copy.volume_id });
        await c().controller("DeleteVolume", { volume_id: restored.volume_id });
        const r = await tryRun("zfs", "list", "-H", "-o", "name", `${pool.parent}/copy`);
        assert.notEqual(r.code, 0);
      },
    );
  } finally {
    await plugin.stop("SIGKILL");
  }
});

Deno.test("modes: node serves no controller, controller serves no node", async () => {
  await using pool = await TestPool.create();
  for (
    const [mode, hasController, hasNode] of [["node", false, true], [
      "controller",
      true,
      false,
    ]] as const
  ) {
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: `${pool.dir}/${mode}`,
      extraArgs: ["--mode", mode],
    });
    const caps = await plugin.client.identity("GetPluginCapabilities");
    const services = caps.capabilities.map((x: { service: { type: string } }) => x.service.type);
    assert.equal(services.includes("CONTROLLER_SERVICE"), hasController, mode);
    assert.equal(
      await codeOf(plugin.client.controller("ControllerGetCapabilities")),
      hasController ? 0 : Code.UNIMPLEMENTED,
    );
    assert.equal(await codeOf(plugin.client.node("NodeGetInfo")), hasNode ? 0 : Code.UNIMPLEMENTED);
  }
});

Deno.test("encryption parameters: a keyed volume is created, and its key loaded at stage after an unload", async () => {
  await using pool = await TestPool.create();
  const probe = await tryRun("zfs", "get", "-H", "-o", "value", "encryption", pool.parent);
  if (probe.code !== 0) {
    // zfs-fuse: no encryption. Its refusal is covered by the controller test above.
    const why = probe.stderr.split("\n")[0];
    await Deno.stderr.write(
      new TextEncoder().encode(`encryption parameters: skipped, this ZFS has none (${why})\n`),
    );
    return;
  }
  const keyFile = `${pool.dir}/volume.key`;
  await Deno.writeTextFile(keyFile, "0123456789abcdef".repeat(4));
  // Key files are accepted only below the operator's --key-dir.
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    extraArgs: ["--key-dir", pool.dir],
  });
  const res = await plugin.client.controller(
    "CreateVolume",
    createVolumeRequest("secret", {
      parameters: { encryption: "on", keyformat: "hex", keylocation: `file://${keyFile}` },
    }),
  );
  const ds = `${pool.parent}/secret`;
  assert.notEqual(await pool.get(ds, "encryption"), "off");
  assert.equal(await pool.get(ds, "keystatus"), "available");
  let a = await claimVolume(plugin, res.volume, "alloc-1");
  await Deno.writeTextFile(`${a.target}/x`, "kept");
  await a.release();
  // As after a reboot: unmounted, key not loaded.
  await sh("zfs", "unmount", ds);
  await sh("zfs", "unload-key", ds);
  a = await claimVolume(plugin, res.volume, "alloc-2");
  assert.equal(await Deno.readTextFile(`${a.target}/x`), "kept");
  await a.release();
});
