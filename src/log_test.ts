import assert from "node:assert/strict";
import { ZfsError } from "./errors.ts";
import { Logger, type LogLevel, redact } from "./log.ts";

function collect(
  level: LogLevel = "debug",
): { log: Logger; records: () => Record<string, unknown>[]; lines: string[] } {
  const lines: string[] = [];
  const log = new Logger(level, {}, (line) => lines.push(line));
  return { log, lines, records: () => lines.map((l) => JSON.parse(l)) };
}

Deno.test("Logger writes one JSON object per line with ts, level, msg and fields", () => {
  const { log, lines, records } = collect();
  log.info("volume staged", { volumeId: "v1", durationMs: 12.5 });
  assert.equal(lines.length, 1);
  assert.equal(lines[0]!.includes("\n"), false);
  const [r] = records();
  assert.deepEqual(Object.keys(r!), ["ts", "level", "msg", "volumeId", "durationMs"]);
  assert.equal(r!.level, "info");
  assert.equal(r!.msg, "volume staged");
  assert.equal(r!.volumeId, "v1");
  assert.equal(r!.durationMs, 12.5);
  assert.match(String(r!.ts), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
});

Deno.test("Logger drops lines below its level", () => {
  const { log, records } = collect("warn");
  log.debug("d");
  log.info("i");
  log.warn("w");
  log.error("e");
  assert.deepEqual(records().map((r) => [r.level, r.msg]), [["warn", "w"], ["error", "e"]]);
  assert.equal(log.enabled("info"), false);
  assert.equal(log.enabled("warn"), true);
});

Deno.test("Logger at debug writes every level", () => {
  const { log, records } = collect("debug");
  log.debug("d");
  log.info("i");
  log.warn("w");
  log.error("e");
  assert.deepEqual(records().map((r) => r.level), ["debug", "info", "warn", "error"]);
});

Deno.test("Logger redacts secrets wherever they appear", () => {
  const { log, lines, records } = collect();
  log.info("rpc", {
    request: {
      volume_id: "v1",
      secrets: { password: "hunter2", apiKey: "k-123" },
      nested: [{ Secrets: { a: "s3cr3t" } }, { token: "tok-1" }],
    },
    password: "pw-1",
  });
  for (const secret of ["hunter2", "k-123", "s3cr3t", "tok-1", "pw-1"]) {
    assert.equal(lines[0]!.includes(secret), false, `${secret} leaked`);
  }
  const [r] = records();
  assert.deepEqual(r!.request, {
    volume_id: "v1",
    secrets: "[2 redacted]",
    nested: [{ Secrets: "[1 redacted]" }, { token: "[redacted]" }],
  });
  assert.equal(r!.password, "[redacted]");
});

Deno.test("redact leaves non-secret values as they are", () => {
  assert.deepEqual(redact({ a: 1, b: ["x", null], c: { d: true } }), {
    a: 1,
    b: ["x", null],
    c: { d: true },
  });
  assert.equal(redact("secrets"), "secrets");
  assert.equal(redact(null), null);
});

Deno.test("Logger.child adds its fields to every line without changing the parent", () => {
  const { log, records } = collect();
  const child = log.child({ method: "NodeStageVolume" });
  const grandchild = child.child({ volumeId: "v1" });
  grandchild.info("a", { extra: 1 });
  child.info("b");
  log.info("c");
  const [a, b, c] = records();
  assert.equal(a!.method, "NodeStageVolume");
  assert.equal(a!.volumeId, "v1");
  assert.equal(a!.extra, 1);
  assert.equal(b!.method, "NodeStageVolume");
  assert.equal("volumeId" in b!, false);
  assert.equal("method" in c!, false);
});

Deno.test("Logger.child keeps the level of its parent", () => {
  const { log, records } = collect("error");
  log.child({ a: 1 }).warn("dropped");
  log.child({ a: 1 }).error("kept");
  assert.deepEqual(records().map((r) => r.msg), ["kept"]);
});

Deno.test("Logger writes an Error field with its name, message and cause", () => {
  const { log, records } = collect();
  log.error("failed", { error: new TypeError("bad thing", { cause: new Error("root") }) });
  assert.deepEqual(records()[0]!.error, {
    name: "TypeError",
    message: "bad thing",
    cause: { name: "Error", message: "root" },
  });
});

Deno.test("Logger writes a ZfsError with its kind, argv and stderr", () => {
  const { log, records } = collect();
  log.warn("zfs", { error: new ZfsError("busy", ["zfs", "destroy", "t/v"], "dataset is busy\n") });
  assert.deepEqual(records()[0]!.error, {
    name: "ZfsError",
    message: 'Command "zfs destroy t/v" failed (busy): dataset is busy',
    kind: "busy",
    argv: ["zfs", "destroy", "t/v"],
    stderr: "dataset is busy\n",
  });
});

Deno.test("Logger writes bigints as strings", () => {
  const { log, records } = collect();
  log.info("n", { bytes: 2n ** 64n });
  assert.equal(records()[0]!.bytes, "18446744073709551616");
});
