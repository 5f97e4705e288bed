import assert from "node:assert/strict";
import { Code, CsiError, ZfsError } from "../errors.ts";
import type { PropertyValue } from "../zfs/parse.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { checkOwned, Datasets, VOLUME_PROPERTIES } from "./datasets.ts";

function props(entries: Record<string, string>): Map<string, PropertyValue> {
  return new Map(Object.entries(entries).map(([k, value]) => [k, { value, source: "local" }]));
}

function datasets(runner: FakeRunner): Datasets {
  const { zfs, mounter } = fakeTools(runner);
  return new Datasets(zfs, mounter);
}

const GET = ["zfs", "get", "-Hp", "-o", "name,property,value,source", VOLUME_PROPERTIES.join(",")];

function getOutput(dataset: string, over: Record<string, string> = {}): string {
  const values: Record<string, string> = {
    type: "filesystem",
    mountpoint: `/${dataset}`,
    mounted: "yes",
    refquota: "1073741824",
    used: "98304",
    available: "1073643520",
    "org.zfs-csi:managed": "yes",
    ...over,
  };
  // A marker set on the dataset itself reads "local", as zfs reports it.
  return Object.entries(values).map(([k, v]) =>
    `${dataset}\t${k}\t${v}\t${k.includes(":") ? "local" : "-"}`
  ).join("\n") + "\n";
}

Deno.test("checkOwned accepts a marked filesystem", () => {
  assert.doesNotThrow(() =>
    checkOwned("t/v", props({ "org.zfs-csi:managed": "yes", type: "filesystem" }))
  );
});

Deno.test("checkOwned refuses unmarked datasets and volumes with FAILED_PRECONDITION", () => {
  const table: ReadonlyArray<readonly [Record<string, string>, string]> = [
    [{ type: "filesystem" }, 'Dataset "t/v" exists but is not managed by zfs-csi'],
    [
      { type: "filesystem", "org.zfs-csi:managed": "no" },
      'Dataset "t/v" exists but is not managed',
    ],
    [{ type: "volume", "org.zfs-csi:managed": "yes" }, 'Dataset "t/v" is not a filesystem'],
  ];
  for (const [entries, message] of table) {
    assert.throws(() => checkOwned("t/v", props(entries)), (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, Code.FAILED_PRECONDITION);
      assert.ok(err.message.startsWith(message), err.message);
      return true;
    });
  }
});

Deno.test("checkOwned refuses a marker inherited from the parent dataset", () => {
  for (const source of ["inherited from t", "default", "-"]) {
    const p = new Map([
      ["type", { value: "filesystem", source: "-" }],
      ["org.zfs-csi:managed", { value: "yes", source }],
    ]);
    assert.throws(() => checkOwned("t/v", p), (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, Code.FAILED_PRECONDITION);
      return true;
    }, source);
  }
  for (const source of ["local", "received"]) {
    checkOwned(
      "t/v",
      new Map([
        ["type", { value: "filesystem", source: "-" }],
        ["org.zfs-csi:managed", { value: "yes", source }],
      ]),
    );
  }
});

Deno.test("Datasets.get returns the dataset's mountpoint, mounted state and refquota", async () => {
  const runner = new FakeRunner().on(GET, { stdout: getOutput("t/n/v") });
  assert.deepEqual(await datasets(runner).get("v", "t/n/v"), {
    dataset: "t/n/v",
    mountpoint: "/t/n/v",
    mounted: true,
    refquota: 1073741824,
  });
  assert.deepEqual(runner.argvs, [[...GET, "t/n/v"]]);
});

Deno.test("Datasets.get answers NOT_FOUND naming the volume and dataset", async () => {
  const runner = new FakeRunner().on(GET, {
    code: 1,
    stderr: "cannot open 't/n/v': dataset does not exist\n",
  });
  await assert.rejects(datasets(runner).get("v", "t/n/v"), (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.NOT_FOUND);
    assert.equal(err.message, 'Volume "v" not found (no dataset "t/n/v")');
    return true;
  });
});

Deno.test("Datasets.ensureMounted checks ownership when another creator won the race", async () => {
  const runner = new FakeRunner()
    .on(GET, { code: 1, stderr: "cannot open 't/n/v': dataset does not exist\n" }, { times: 1 })
    .on(["zfs", "create"], { code: 1, stderr: "cannot create 't/n/v': dataset already exists\n" })
    .on(GET, { stdout: getOutput("t/n/v", { "org.zfs-csi:managed": "-" }) });
  await assert.rejects(datasets(runner).ensureMounted("v", "t/n/v", 1024), (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.FAILED_PRECONDITION);
    return true;
  });
  // The mount table read alongside the first zfs get is of no use once the dataset is missing.
  assert.deepEqual(runner.argvs.map((a) => a.slice(0, 2)), [
    ["zfs", "get"],
    ["mount"],
    ["zfs", "create"],
    ["zfs", "get"],
  ]);
});

Deno.test("Datasets.ensureMounted passes on zfs create failures other than exists", async () => {
  const runner = new FakeRunner()
    .on(GET, { code: 1, stderr: "cannot open 't/n/v': dataset does not exist\n" })
    .on(["zfs", "create"], { code: 1, stderr: "cannot create 't/n/v': out of space\n" });
  await assert.rejects(datasets(runner).ensureMounted("v", "t/n/v", 1024), (err: unknown) => {
    assert.ok(err instanceof ZfsError);
    assert.equal(err.kind, "no_space");
    return true;
  });
});

Deno.test("Datasets.ensureMounted refuses a dataset with a legacy mountpoint", async () => {
  const runner = new FakeRunner().on(GET, { stdout: getOutput("t/n/v", { mountpoint: "legacy" }) });
  await assert.rejects(datasets(runner).ensureMounted("v", "t/n/v"), (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.FAILED_PRECONDITION);
    assert.equal(
      err.message,
      'Dataset "t/n/v" has mountpoint "legacy"; zfs-csi needs it mounted by zfs (run "zfs inherit mountpoint t/n/v")',
    );
    return true;
  });
  assert.deepEqual(runner.argvs, [[...GET, "t/n/v"], ["mount"]]);
});

Deno.test("Datasets.ensureMounted reads the mount table alongside the properties of a mounted dataset", async () => {
  let running = 0;
  let most = 0;
  const slow = (stdout: string) => async () => {
    running++;
    most = Math.max(most, running);
    await new Promise((r) => setTimeout(r, 20));
    running--;
    return { stdout };
  };
  const runner = new FakeRunner()
    .on(GET, slow(getOutput("t/n/v")))
    .on(["mount"], slow("t/n/v on /t/n/v type fuse.zfs (rw,relatime,user_id=0,group_id=0)\n"));
  const ds = await datasets(runner).ensureMounted("v", "t/n/v");
  assert.equal(ds.mountpoint, "/t/n/v");
  assert.deepEqual(ds.table.map((e) => e.mountPoint), ["/t/n/v"]);
  // One zfs get and one mount listing, running at the same time.
  assert.deepEqual(runner.argvs, [[...GET, "t/n/v"], ["mount"]]);
  assert.equal(most, 2);
});

Deno.test("Datasets.ensureMounted reads the mount table again after mounting the dataset", async () => {
  let mounted = false;
  const runner = new FakeRunner()
    .on(GET, () => ({ stdout: getOutput("t/n/v", { mounted: mounted ? "yes" : "no" }) }))
    .on(["zfs", "mount"], () => {
      mounted = true;
      return {};
    })
    .on(["mount"], () => ({
      stdout: mounted ? "t/n/v on /t/n/v type fuse.zfs (rw,relatime,user_id=0,group_id=0)\n" : "",
    }));
  const ds = await datasets(runner).ensureMounted("v", "t/n/v");
  assert.deepEqual(ds.table.map((e) => e.source), ["t/n/v"]);
  assert.deepEqual(runner.argvs.map((a) => a.slice(0, 2)), [
    ["zfs", "get"],
    ["mount"],
    ["zfs", "mount"],
    ["mount"],
  ]);
});

/** A runner whose zfs reports t/n/v mounted at /t/n/v and whose mount table is `lines`. */
function mountedWith(lines: readonly string[]): FakeRunner {
  return new FakeRunner()
    .on(GET, { stdout: getOutput("t/n/v") })
    .onExact(["mount"], { stdout: lines.map((l) => l + "\n").join("") });
}

Deno.test("Datasets.ensureMounted refuses a dataset with another mount stacked on its mountpoint", async () => {
  const own = "t/n/v on /t/n/v type zfs (rw,xattr,noacl)";
  const cases: ReadonlyArray<readonly [string, string, string]> = [
    [
      "an admin's bind mount of another directory",
      "/dev/vda on /t/n/v type ext4 (rw,relatime)",
      '"/dev/vda" (ext4)',
    ],
    [
      "a user's FUSE mount named like the dataset",
      "t/n/v on /t/n/v type fuse.zfs (rw,nosuid,nodev,relatime,user_id=1000,group_id=1000)",
      '"t/n/v" (fuse.zfs, user_id=1000)',
    ],
    [
      "a received copy with the same mountpoint",
      "t/n/copy on /t/n/v type zfs (rw,xattr,noacl)",
      '"t/n/copy" (zfs)',
    ],
  ];
  for (const [name, onTop, shown] of cases) {
    const runner = mountedWith([own, onTop]);
    await assert.rejects(datasets(runner).ensureMounted("v", "t/n/v"), (err: unknown) => {
      assert.ok(err instanceof CsiError, name);
      assert.equal(err.code, Code.FAILED_PRECONDITION, name);
      assert.equal(
        err.message,
        `Dataset "t/n/v" is mounted at "/t/n/v", but another mount lies on top of it there: ` +
          `${shown}; unmount that (umount "/t/n/v") and retry`,
        name,
      );
      return true;
    });
    // Nothing but the two reads.
    assert.deepEqual(runner.argvs, [[...GET, "t/n/v"], ["mount"]], name);
  }
  // The dataset on top of something else at its mountpoint is fine: a bind takes the top.
  const ok = await datasets(mountedWith(["/dev/vda on /t/n/v type ext4 (rw)", own]))
    .ensureMounted("v", "t/n/v");
  assert.equal(ok.mountpoint, "/t/n/v");
});

Deno.test("Datasets.ensureMounted does not take a user's FUSE mount for the dataset", async () => {
  // zfs says mounted, but all the plugin sees there is a FUSE mount a user made with its name.
  const runner = mountedWith([
    "t/n/v on /t/n/v type fuse.zfs (rw,nosuid,nodev,relatime,user_id=1000,group_id=1000)",
  ]);
  await assert.rejects(datasets(runner).ensureMounted("v", "t/n/v"), (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.FAILED_PRECONDITION);
    assert.match(err.message, /but the plugin cannot see it there/);
    return true;
  });
});

Deno.test("Datasets.ensureMounted learns which type ZFS mounts as from the dataset's own mount", async () => {
  const runner = mountedWith([
    "t/n/v on /t/n/v type zfs (rw,xattr,noacl)",
    "t/n/v on /local/csi/staging/v/rw type fuse.zfs (rw,relatime,user_id=0,group_id=0)",
  ]);
  const { zfs, mounter } = fakeTools(runner);
  await new Datasets(zfs, mounter).ensureMounted("v", "t/n/v");
  assert.equal(mounter.judge().fsType, "zfs");
});

Deno.test("Datasets.ensureMounted never mounts a dataset at a mountpoint a received stream set", async () => {
  // What `zfs send -p | zfs receive` leaves: the stream's mountpoint, source "received".
  const out = getOutput("t/n/v", { mounted: "no" }).replace(
    "t/n/v\tmountpoint\t/t/n/v\t-",
    "t/n/v\tmountpoint\t/etc/cron.d\treceived",
  );
  const runner = new FakeRunner().on(GET, { stdout: out }).on(["mount"], { stdout: "" });
  await assert.rejects(datasets(runner).ensureMounted("v", "t/n/v"), (err: unknown) => {
    assert.ok(err instanceof CsiError, String(err));
    assert.equal(err.code, Code.FAILED_PRECONDITION);
    assert.match(err.message, /mountpoint "\/etc\/cron\.d".*received/);
    assert.match(err.message, /zfs inherit mountpoint t\/n\/v/);
    return true;
  });
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "mount"), [], "nothing mounted");
});

Deno.test("Datasets.ensureMounted mounts at a mountpoint the operator set locally (an adopted dataset)", async () => {
  let mounted = false;
  const runner = new FakeRunner()
    .on(GET, () => ({
      stdout: getOutput("t/n/v", { mounted: mounted ? "yes" : "no" }).replace(
        "t/n/v\tmountpoint\t/t/n/v\t-",
        "t/n/v\tmountpoint\t/t/n/v\tlocal",
      ),
    }))
    .on(["zfs", "mount"], () => {
      mounted = true;
      return {};
    })
    .on(["mount"], () => ({
      stdout: mounted ? "t/n/v on /t/n/v type fuse.zfs (rw,relatime,user_id=0,group_id=0)\n" : "",
    }));
  const ds = await datasets(runner).ensureMounted("v", "t/n/v");
  assert.equal(ds.mountpoint, "/t/n/v");
});
