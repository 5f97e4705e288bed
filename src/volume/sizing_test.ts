import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import {
  orderedChanges,
  planSize,
  recordedSizeParameters,
  SIZE_STATE,
  type Sizes,
} from "./sizing.ts";

const MiB = 1024 * 1024;
const PARAMS = "org.zfs-csi:parameters";

/** A volume's properties as `zfs get -Hp` reads them: sizes in bytes, parameters as recorded. */
function volume(
  sizes: { refquota: number; quota?: number; refreservation?: number },
  parameters?: string,
): PropertyMap {
  const row = (value: number) => ({ value: String(value), source: value ? "local" : "default" });
  return new Map([
    ["type", { value: "filesystem", source: "-" }],
    ["org.zfs-csi:managed", { value: "yes", source: "local" }],
    [
      PARAMS,
      parameters === undefined
        ? { value: "-", source: "-" }
        : { value: parameters, source: "local" },
    ],
    ["refquota", row(sizes.refquota)],
    ["quota", row(sizes.quota ?? 0)],
    ["refreservation", row(sizes.refreservation ?? 0)],
  ]);
}

const need = (requiredBytes: number, limitBytes = 0) => ({ requiredBytes, limitBytes });

Deno.test("SIZE_STATE reads ownership, the recorded parameters and the size properties", () => {
  assert.deepEqual(SIZE_STATE, [
    "type",
    "org.zfs-csi:managed",
    PARAMS,
    "refquota",
    "quota",
    "refreservation",
  ]);
});

Deno.test("planSize computes every target from the recorded parameters and the capacity", () => {
  const both = '{"quota":"capacity","refreservation":"capacity"}';
  const table: ReadonlyArray<
    readonly [
      label: string,
      props: PropertyMap,
      capacity: { requiredBytes: number; limitBytes: number },
      refquota: number,
      changes: ReadonlyArray<readonly [string, string]>,
    ]
  > = [
    [
      "growth: quota first, refquota, then the reservation",
      volume({ refquota: 64 * MiB, quota: 64 * MiB, refreservation: 64 * MiB }, both),
      need(128 * MiB),
      128 * MiB,
      [["quota", `${128 * MiB}`], ["refquota", `${128 * MiB}`], [
        "refreservation",
        `${128 * MiB}`,
      ]],
    ],
    [
      "a retry after the reservation found no room: already at size, the reservation is set",
      volume({ refquota: 128 * MiB, quota: 128 * MiB, refreservation: 64 * MiB }, both),
      need(128 * MiB),
      128 * MiB,
      [["refreservation", `${128 * MiB}`]],
    ],
    [
      "a retry after a crash that left only the quota raised: quota is not raised again",
      volume({ refquota: 64 * MiB, quota: 128 * MiB, refreservation: 64 * MiB }, both),
      need(128 * MiB),
      128 * MiB,
      [["refquota", `${128 * MiB}`], ["refreservation", `${128 * MiB}`]],
    ],
    [
      "everything right: nothing to set",
      volume({ refquota: 128 * MiB, quota: 128 * MiB, refreservation: 128 * MiB }, both),
      need(100 * MiB),
      128 * MiB,
      [],
    ],
    [
      "a fixed quota stays as recorded and a quota moved by hand goes back, last",
      volume({ refquota: 64 * MiB, quota: 400 * MiB }, '{"quota":"200MiB"}'),
      need(128 * MiB),
      128 * MiB,
      [["refquota", `${128 * MiB}`], ["quota", `${200 * MiB}`]],
    ],
    [
      "a fixed refreservation stays as recorded; one raised by hand comes down before refquota",
      volume({ refquota: 64 * MiB, refreservation: 64 * MiB }, '{"refreservation":"1MiB"}'),
      need(100 * MiB, 200 * MiB),
      100 * MiB,
      [["refreservation", `${MiB}`], ["refquota", `${100 * MiB}`]],
    ],
    [
      "no recorded parameters (a volume staged from a context size): refquota only",
      volume({ refquota: 64 * MiB, quota: 80 * MiB, refreservation: 8 * MiB }),
      need(128 * MiB),
      128 * MiB,
      [["refquota", `${128 * MiB}`]],
    ],
    [
      "a smaller request is met by the current size",
      volume({ refquota: 64 * MiB }, "{}"),
      need(32 * MiB),
      64 * MiB,
      [],
    ],
    [
      "an unlimited volume stays unlimited; its quota=capacity is none",
      volume({ refquota: 0, quota: 5 * MiB }, '{"quota":"capacity"}'),
      need(128 * MiB),
      0,
      [["quota", "none"]],
    ],
    [
      "a volume grown past its fixed quota by an older plugin keeps the quota it has",
      volume({ refquota: 128 * MiB, quota: 160 * MiB }, '{"quota":"96MiB"}'),
      need(128 * MiB),
      128 * MiB,
      [],
    ],
    [
      "the other recorded parameters do not matter, even ones this plugin does not know",
      volume({ refquota: 64 * MiB, quota: 64 * MiB }, '{"frobnicate":"yes","quota":"capacity"}'),
      need(96 * MiB),
      96 * MiB,
      [["quota", `${96 * MiB}`], ["refquota", `${96 * MiB}`]],
    ],
  ];
  for (const [label, props, capacity, refquota, changes] of table) {
    assert.deepEqual(planSize("v1@n1", props, capacity), { refquota, changes }, label);
  }
});

Deno.test("planSize converges: planning again on the planned state changes nothing", () => {
  const params = '{"quota":"capacity","refreservation":"capacity"}';
  let sizes = { refquota: 64 * MiB, quota: 128 * MiB, refreservation: 0 };
  for (let i = 0; i < 3; i++) {
    const plan = planSize("v1", volume(sizes, params), need(128 * MiB));
    const set = Object.fromEntries(plan.changes.map(([k, v]) => [k, Number(v)]));
    sizes = { ...sizes, ...set };
    assert.deepEqual(sizes, { refquota: 128 * MiB, quota: 128 * MiB, refreservation: 128 * MiB });
    if (i > 0) assert.deepEqual(plan.changes, [], `round ${i}`);
  }
});

Deno.test("planSize refuses to shrink or to grow past a fixed quota, before anything is set", () => {
  assertThrowsCsi(
    () => planSize("v1@n1", volume({ refquota: 64 * MiB }, "{}"), need(0, 32 * MiB)),
    Code.OUT_OF_RANGE,
    'Volume "v1@n1" has 67108864 bytes; shrinking to 33554432 is not supported',
  );
  assertThrowsCsi(
    () =>
      planSize(
        "v1@n1",
        volume({ refquota: 64 * MiB, quota: 96 * MiB }, '{"quota":"96MiB"}'),
        need(128 * MiB),
      ),
    Code.OUT_OF_RANGE,
    'Volume "v1@n1" cannot grow to 134217728 bytes: it was created with quota=100663296 bytes, ' +
      "which bounds its data and snapshots together; nothing was changed. Create a copy with a " +
      "larger quota, or quota=capacity, from a snapshot of it",
  );
  // Up to the fixed quota is fine.
  assert.deepEqual(
    planSize(
      "v1",
      volume({ refquota: 64 * MiB, quota: 96 * MiB }, '{"quota":"96MiB"}'),
      need(96 * MiB),
    ),
    { refquota: 96 * MiB, changes: [["refquota", `${96 * MiB}`]] },
  );
});

Deno.test("recordedSizeParameters reads quota and refreservation, and refuses a record it cannot read", () => {
  assert.equal(recordedSizeParameters("v1", volume({ refquota: 1 })), undefined);
  const p = recordedSizeParameters(
    "v1",
    volume({ refquota: 1 }, '{"compression":"lz4","quota":"1GiB","refreservation":"capacity"}'),
  );
  assert.deepEqual(p?.quota, { kind: "bytes", bytes: 1024 * MiB });
  assert.deepEqual(p?.refreservation, { kind: "capacity" });
  for (
    const [text, why] of [
      ["{not json", /^Volume "v1" has unreadable recorded parameters \(org\.zfs-csi:parameters=/],
      ['["quota"]', /not a JSON object/],
      ['{"quota":5}', /"quota" is not a string/],
      ['{"quota":"lots"}', /must be a size/],
    ] as const
  ) {
    assertThrowsCsi(
      () => recordedSizeParameters("v1", volume({ refquota: 1 }, text)),
      Code.FAILED_PRECONDITION,
      why,
      text,
    );
  }
});

Deno.test("orderedChanges orders each change so that it succeeds on its own", () => {
  const at = (refquota: number, quota: number, refreservation: number): Sizes => ({
    refquota,
    quota,
    refreservation,
  });
  const table: ReadonlyArray<
    readonly [
      string,
      Sizes,
      Partial<Record<"refquota" | "quota" | "refreservation", number>>,
      string[],
    ]
  > = [
    ["all up", at(1, 1, 1), { refquota: 2, quota: 2, refreservation: 2 }, [
      "quota",
      "refquota",
      "refreservation",
    ]],
    ["all down", at(2, 2, 2), { refquota: 1, quota: 1, refreservation: 1 }, [
      "refreservation",
      "refquota",
      "quota",
    ]],
    ["quota down, the rest up", at(1, 9, 1), { refquota: 2, quota: 2, refreservation: 2 }, [
      "refquota",
      "refreservation",
      "quota",
    ]],
    ["reservation down, refquota up", at(1, 0, 5), { refquota: 2, refreservation: 1 }, [
      "refreservation",
      "refquota",
    ]],
    ["unmanaged properties are left alone", at(1, 7, 7), { refquota: 2 }, ["refquota"]],
    ["nothing differs", at(1, 2, 3), { refquota: 1, quota: 2, refreservation: 3 }, []],
  ];
  for (const [label, current, target, names] of table) {
    assert.deepEqual(orderedChanges(current, target).map(([n]) => n), names, label);
  }
  assert.deepEqual(orderedChanges(at(1, 5, 5), { quota: 0, refreservation: 0 }), [
    ["refreservation", "none"],
    ["quota", "none"],
  ]);
});
