import assert from "node:assert/strict";
import { parseSize } from "./size.ts";

Deno.test("parseSize reads sizes with binary and decimal units", () => {
  const table: ReadonlyArray<readonly [string, number]> = [
    ["1073741824", 1073741824],
    ["1", 1],
    ["512b", 512],
    ["1K", 1024],
    ["500M", 500 * 1024 ** 2],
    ["10G", 10 * 1024 ** 3],
    ["2T", 2 * 1024 ** 4],
    ["1P", 1024 ** 5],
    ["10GiB", 10 * 1024 ** 3],
    ["10gib", 10 * 1024 ** 3],
    ["1MiB", 1024 ** 2],
    ["1KiB", 1024],
    ["1TiB", 1024 ** 4],
    ["1KB", 1000],
    ["10GB", 10 * 1000 ** 3],
    ["1MB", 1000 ** 2],
    ["1.5K", 1536],
    ["1.5GiB", 1.5 * 1024 ** 3],
    [" 10 GiB ", 10 * 1024 ** 3],
  ];
  for (const [text, bytes] of table) assert.equal(parseSize(text), bytes, text);
});

Deno.test("parseSize rounds fractional bytes up", () => {
  assert.equal(parseSize("1.1"), 2);
  assert.equal(parseSize("0.001K"), 2);
});

Deno.test("parseSize throws a RangeError for text that is not a size", () => {
  for (const text of ["", "abc", "10XB", "-1G", "1e9", "1,5G", "G", "10 G B", "0x10"]) {
    assert.throws(() => parseSize(text), {
      name: "RangeError",
      message: `Size "${text}" is not a size such as 10GiB, 500M or 1073741824`,
    });
  }
});

Deno.test("parseSize throws a RangeError for zero and sizes of 2^53 bytes or more", () => {
  for (const text of ["0", "0G", "0.0", "8P", "9007199254740992", "99999999999PiB"]) {
    assert.throws(() => parseSize(text), {
      name: "RangeError",
      message: `Size "${text}" is out of range`,
    });
  }
  assert.equal(parseSize("9007199254740991"), 9007199254740991);
});
