import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import { parseVolblocksize, parseZvolParameters, planZvolSize } from "./zvol.ts";

const GiB = 1024 * 1024 * 1024;
const MiB = 1024 * 1024;

Deno.test("parseVolblocksize takes powers of two from 4K to 128K, in zfs's spelling", () => {
  const table: [string, number][] = [
    ["4K", 4096],
    ["4k", 4096],
    ["16K", 16384],
    ["16384", 16384],
    ["128K", 131072],
  ];
  for (const [text, bytes] of table) assert.equal(parseVolblocksize(text), bytes, text);
  for (const bad of ["2K", "256K", "1M", "12K", "16 K", "16KiB", "", "0", "-16K", "16K;"]) {
    assertThrowsCsi(() => parseVolblocksize(bad), Code.INVALID_ARGUMENT, /power of two/, bad);
  }
});

Deno.test("parseZvolParameters takes out the zvol's own, keeps what applies to a zvol, refuses the rest", () => {
  assert.deepEqual(
    parseZvolParameters(
      {
        fs_type: "ext4",
        volblocksize: "16K",
        sparse: "false",
        compression: "zstd",
        "com.example:team": "db",
      },
      { allowSparse: false },
    ),
    {
      volblocksize: "16K",
      volblocksizeBytes: 16384,
      sparse: false,
      rest: { compression: "zstd", "com.example:team": "db" },
    },
  );
  assert.equal(parseZvolParameters({ sparse: "true" }, { allowSparse: true }).sparse, true);
  const refused: [Record<string, string>, RegExp][] = [
    [{ sparse: "true" }, /--allow-sparse-zvols/],
    [{ recordsize: "1M" }, /does not apply to a zvol/],
    [{ atime: "off" }, /does not apply to a zvol/],
    [{ refreservation: "capacity" }, /does not apply to a zvol/],
  ];
  for (const [params, message] of refused) {
    assertThrowsCsi(
      () => parseZvolParameters(params, { allowSparse: false }),
      Code.INVALID_ARGUMENT,
      message,
    );
  }
});

Deno.test("planZvolSize: the asked size in whole 128K steps, 1 GiB by default, 300 MiB for xfs, within the limit", () => {
  const plan = (required: number, limit: number, content: "block" | "ext4" | "xfs" = "block") =>
    planZvolSize({ requiredBytes: required, limitBytes: limit }, content, MiB);
  assert.equal(plan(0, 0), GiB);
  assert.equal(plan(GiB, 0), GiB);
  assert.equal(plan(GiB + 1, 0), GiB + 128 * 1024);
  assert.equal(plan(0, 10 * GiB), GiB);
  assert.equal(plan(0, 512 * MiB), 512 * MiB);
  assert.equal(plan(1, 0), MiB);
  assert.equal(plan(1, 0, "xfs"), 300 * MiB);
  assertThrowsCsi(() => plan(0, 100 * MiB, "xfs"), Code.OUT_OF_RANGE);
  assertThrowsCsi(() => plan(GiB + 1, GiB + 1000), Code.OUT_OF_RANGE);
});
