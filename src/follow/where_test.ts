/**
 * Where a follow volume is: the condition and published node read from its owner object, and
 * the controller's ListVolumes / ControllerGetVolume / CreateVolume answers built from them
 * (the store in memory, a fake pool for this node's own datasets).
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { fakeController, fakeServices, fsCap } from "../../tests/support/service_harness.ts";
import type { CreateVolumeRequest } from "../csi/types.ts";
import { type Store, StoreError } from "../store/store.ts";
import { NODE_TOPOLOGY_KEY } from "../version.ts";
import { FOLLOW_GENERATION_PROPERTY } from "./copy.ts";
import { followVolumesPrefix, listMarked, standbyPrefix } from "./markers.ts";
import { acquire, moveHead, type OwnerRecord, readOwner } from "./owner.ts";
import type { StandbyState } from "./standby.ts";
import { followVolumeStatus } from "./where.ts";

const PARENT = "tank/nomad";
const NOW = Date.parse("2026-01-01T01:00:00Z");

function record(over: Partial<OwnerRecord> = {}): OwnerRecord {
  return {
    format: 1,
    volume: "pg",
    uid: "b".repeat(32),
    holder: "node-a",
    generation: 3,
    state: "held",
    head: "123",
    headAt: "2026-01-01T00:58:30Z",
    renewedAt: "2026-01-01T00:59:50Z",
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    ...over,
  };
}

Deno.test("followVolumeStatus: the holder is the published node; the condition says generation and head age", () => {
  const s = followVolumeStatus(record(), NOW);
  assert.deepEqual(s.published_node_ids, ["node-a"]);
  assert.equal(s.volume_condition.abnormal, false);
  assert.match(s.volume_condition.message, /^Held by node "node-a" \(generation 3;/);
  assert.match(s.volume_condition.message, /last copy in the store is 1m30s old .*guid 123/);
});

Deno.test("followVolumeStatus: released, never held, standbys, and this node's standby state", () => {
  const released = followVolumeStatus(
    record({ state: "released", standbys: ["node-b", "node-c"] }),
    NOW,
  );
  assert.deepEqual(released.published_node_ids, []);
  assert.match(
    released.volume_condition.message,
    /Not staged on any node; released by node "node-a"/,
  );
  assert.match(released.volume_condition.message, /standby nodes: node-b, node-c/);
  const fresh = followVolumeStatus(
    record({ state: "released", holder: null, generation: 0, head: null, headAt: null }),
    NOW,
  );
  assert.match(fresh.volume_condition.message, /no node has held it yet; the store holds no copy/);
  const failing: StandbyState = { checkedAt: NOW - 5000, current: false, error: "zfs said no" };
  const bad = followVolumeStatus(record(), NOW, failing);
  assert.equal(bad.volume_condition.abnormal, true);
  assert.match(
    bad.volume_condition.message,
    /standby copy cannot catch up \(as of 5s ago\): zfs said no/,
  );
  const ok = followVolumeStatus(record(), NOW, { checkedAt: NOW, current: true, guid: "123" });
  assert.equal(ok.volume_condition.abnormal, false);
  assert.match(ok.volume_condition.message, /standby copy was at the store's head 0s ago/);
});

/** The store, failing what `fail` names with "unavailable" while `down.on` is set. */
function flaky(store: MemoryStore, fail: "list" | "getBytes", down: { on: boolean }): Store {
  const unavailable = () =>
    Promise.reject(new StoreError("unavailable", "the store is unreachable (test)"));
  return {
    description: store.description,
    putStream: (key, body, options) => store.putStream(key, body, options),
    putBytes: (key, bytes, condition) => store.putBytes(key, bytes, condition),
    getStream: (key, options) => store.getStream(key, options),
    getBytes: (key) => down.on && fail === "getBytes" ? unavailable() : store.getBytes(key),
    list: (prefix) => down.on && fail === "list" ? unavailable() : store.list(prefix),
    delete: (key) => store.delete(key),
  };
}

function controller(standby?: StandbyState, wrap: (s: MemoryStore) => Store = (s) => s) {
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--store", "file:///srv/backups"],
    host: (runner) => new FakePool(runner),
  });
  const pool = parts.host;
  pool.add(PARENT, { "org.zfs-csi:managed": ["-", "-"] });
  const store = new MemoryStore();
  const service = fakeController(parts, {
    follow: {
      store: wrap(store),
      ttlSeconds: 30,
      standby: { state: (name) => name === "pg" ? standby : undefined },
    },
  });
  return { service, store, pool };
}

function createReq(name: string, parameters: Record<string, string>): CreateVolumeRequest {
  return {
    name,
    capacity_range: { required_bytes: String(1 << 30), limit_bytes: "0" },
    volume_capabilities: [fsCap()],
    parameters: { follow: "true", ...parameters },
    accessibility_requirements: { requisite: [], preferred: [] },
    secrets: {},
    volume_content_source: null,
    mutable_parameters: {},
  } as unknown as CreateVolumeRequest;
}

Deno.test("CreateVolume with standby_nodes answers one topology per standby and records them", async () => {
  const { service, store } = controller();
  const answer = await service.CreateVolume(
    createReq("pg", { standby_nodes: "node-c,node-b" }),
  ) as {
    volume: Record<string, unknown>;
  };
  assert.deepEqual(answer.volume.accessible_topology, [
    { segments: { [NODE_TOPOLOGY_KEY]: "node-b" } },
    { segments: { [NODE_TOPOLOGY_KEY]: "node-c" } },
  ]);
  const owner = (await readOwner(store, "pg"))!.record;
  assert.deepEqual(owner.standbys, ["node-b", "node-c"]);
  assert.equal(owner.settings.properties.standby_nodes, undefined, "not a dataset property");
  assert.deepEqual((await listMarked(store, standbyPrefix("node-b"))).map((v) => v.name), ["pg"]);
  // The same again is a retry; other standbys are another volume.
  assert.deepEqual(
    await service.CreateVolume(createReq("pg", { standby_nodes: "node-b,node-c" })),
    answer,
  );
  await assertRejectsCsi(
    service.CreateVolume(createReq("pg", { standby_nodes: "node-b" })),
    Code.ALREADY_EXISTS,
    /standby nodes/,
  );
  // Deleted: its markers go with it.
  await service.DeleteVolume({ volume_id: "pg@*", secrets: {} } as never);
  assert.deepEqual(await listMarked(store, standbyPrefix("node-b")), []);
  assert.deepEqual(await listMarked(store, followVolumesPrefix()), []);
});

Deno.test("ListVolumes lists each follow volume once, with its holder; this node's copy is not a volume of its own", async () => {
  const { service, store, pool } = controller({ checkedAt: Date.now(), current: true });
  await service.CreateVolume(createReq("pg", { standby_nodes: "n1" }));
  await service.CreateVolume(createReq("web", {}));
  const { holding } = await acquire(store, "pg", {
    node: "node-a",
    nowMs: Date.now(),
    ttlSeconds: 30,
    mayTakeOver: () => ({ ok: true }),
  });
  await moveHead(store, "pg", holding, { guid: "77", createdAt: new Date().toISOString() }, 0);
  // This node's standby copy of "pg", and a volume of its own.
  pool.add(`${PARENT}/pg`, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: "0",
    refquota: "0",
    referenced: "0",
  });
  pool.add(`${PARENT}/local`, { "org.zfs-csi:managed": "yes", refquota: "0", referenced: "0" });
  const res = await service.ListVolumes({ max_entries: 0, starting_token: "" }) as {
    entries: { volume: { volume_id: string }; status: Record<string, unknown> }[];
    next_token: string;
  };
  assert.deepEqual(res.entries.map((e) => e.volume.volume_id), ["local@n1", "pg@*", "web@*"]);
  const pg = res.entries[1]!;
  assert.deepEqual(pg.status.published_node_ids, ["node-a"]);
  assert.match(
    (pg.status.volume_condition as { message: string }).message,
    /Held by node "node-a" \(generation 1;.*guid 77.*standby nodes: n1; this node's standby copy was at the store's head/,
  );
  assert.deepEqual(res.entries[2]!.status.published_node_ids, []);
  // Paged: the follow volumes' owner objects are read only for the page they are on.
  const first = await service.ListVolumes({ max_entries: 1, starting_token: "" }) as {
    entries: unknown[];
    next_token: string;
  };
  assert.equal(first.entries.length, 1);
  assert.notEqual(first.next_token, "");
  // ControllerGetVolume answers the same for one.
  const one = await service.ControllerGetVolume({ volume_id: "pg@*" } as never) as {
    status: Record<string, unknown>;
  };
  assert.deepEqual(one.status, pg.status);
  await assertRejectsCsi(
    service.ControllerGetVolume({ volume_id: "gone@*" } as never),
    Code.NOT_FOUND,
  );
});

Deno.test("ListVolumes with the store down lists this node's volumes, and says why a follow volume's place is unknown", async () => {
  for (const fail of ["list", "getBytes"] as const) {
    const down = { on: false };
    const { service, pool } = controller(undefined, (s) => flaky(s, fail, down));
    await service.CreateVolume(createReq("pg", {}));
    pool.add(`${PARENT}/local`, { "org.zfs-csi:managed": "yes", refquota: "0", referenced: "0" });
    down.on = true;
    const res = await service.ListVolumes({ max_entries: 0, starting_token: "" }) as {
      entries: { volume: { volume_id: string }; status: Record<string, unknown> }[];
    };
    if (fail === "list") {
      assert.deepEqual(res.entries.map((e) => e.volume.volume_id), ["local@n1"]);
    } else {
      assert.deepEqual(res.entries.map((e) => e.volume.volume_id), ["local@n1", "pg@*"]);
      assert.deepEqual(res.entries[1]!.status.volume_condition, {
        abnormal: true,
        message: "Where this volume is cannot be read from the store now: the store is " +
          "unreachable (test)",
      });
    }
  }
});
