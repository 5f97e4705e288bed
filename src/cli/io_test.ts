import assert from "node:assert/strict";
import { formatTable, humanBytes, humanSeconds, Progress } from "./io.ts";
import { memoryIo } from "./test_io.ts";

Deno.test("formatTable pads every column but the last to its widest cell", () => {
  assert.deepEqual(formatTable(["A", "LONG HEADER", "Z"], [["wide cell", "x", "end"]]), [
    "A          LONG HEADER  Z",
    "wide cell  x            end",
  ]);
});

Deno.test("humanBytes and humanSeconds read as people write them", () => {
  assert.equal(humanBytes(0), "0 B");
  assert.equal(humanBytes(1023), "1023 B");
  assert.equal(humanBytes(1536), "1.5 KiB");
  assert.equal(humanBytes(64 * 1024 * 1024), "64 MiB");
  assert.equal(humanBytes(2.25 * 1024 ** 3), "2.25 GiB");
  assert.equal(humanBytes(150.4 * 1024 ** 2), "150 MiB");
  assert.equal(humanSeconds(45), "45 s");
  assert.equal(humanSeconds(200), "3 min 20 s");
  assert.equal(humanSeconds(7500), "2 h 5 min");
  assert.equal(humanSeconds(3 * 86400 + 4 * 3600 + 59), "3 d 4 h");
});

Deno.test("Progress writes plain lines at most every 2 s off a terminal, with rate and time left", () => {
  const io = memoryIo(false);
  const p = new Progress(io, "verify pg", 100 * 1024 * 1024);
  io.advance(1000);
  p.add(10 * 1024 * 1024);
  io.advance(500);
  p.add(10 * 1024 * 1024);
  assert.equal(io.stderr.length, 1, "the second update came too soon for a line");
  assert.equal(io.stderr[0], "verify pg: 10 MiB of 100 MiB (10%), 10 MiB/s, about 9 s left");
  io.advance(2500);
  p.add(20 * 1024 * 1024);
  assert.equal(io.stderr[1], "verify pg: 40 MiB of 100 MiB (40%), 10 MiB/s, about 6 s left");
  p.finish();
  assert.equal(io.stderr.length, 3);
});

Deno.test("Progress redraws one bar in place on a terminal and ends its line", () => {
  const io = memoryIo(true);
  const p = new Progress(io, "verify", 1000);
  io.advance(1000);
  p.add(500);
  assert.match(
    io.stderr[0]!,
    // deno-lint-ignore no-control-regex
    /^\r\x1b\[Kverify \[#{15}-{15}\] 500 B of 1000 B \(50%\), 500 B\/s, about 1 s left$/,
  );
  io.advance(1000);
  p.add(500);
  p.finish();
  assert.match(io.stderr.at(-2)!, /\[#{30}\] 1000 B of 1000 B \(100%\)/);
  assert.equal(io.stderr.at(-1), "\n");
});
