import assert from "node:assert/strict";
import {
  codeFiles,
  missingBytes,
  missingV8Flags,
  PAYLOAD_MAGIC,
  permissionMismatches,
  readPayload,
} from "./compile_payload.ts";

const enc = new TextEncoder();
const RUNTIME = enc.encode("\x7fELF the runtime's own bytes");

/** A compiled file as Deno 2.8.3 lays it out: runtime, magic, u64 length, metadata, the rest. */
function compiled(metadata: string, rest = "sources and vfs", runtime = RUNTIME): Uint8Array {
  const meta = enc.encode(metadata);
  const length = new Uint8Array(8);
  new DataView(length.buffer).setBigUint64(0, BigInt(meta.length), true);
  const parts = [runtime, enc.encode(PAYLOAD_MAGIC), length, meta, enc.encode(rest)];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

Deno.test("readPayload: the metadata and the rest after the runtime's bytes", () => {
  const p = readPayload(compiled('{"entrypoint_key":"main.ts","v8_flags":["--x"]}'), RUNTIME);
  assert.deepEqual(p.metadata, { entrypoint_key: "main.ts", v8_flags: ["--x"] });
  assert.equal(new TextDecoder().decode(p.rest), "sources and vfs");
});

Deno.test("readPayload says which part is not as Deno writes it", () => {
  const cases: [Uint8Array, RegExp][] = [
    [RUNTIME, /is no longer than the runtime/],
    [compiled("{}", "", enc.encode("\x7fELF another runtime's bytes!")), /does not start with/],
    [new Uint8Array([...RUNTIME, ...enc.encode("d3n0l4nX12345678{}")]), /no "d3n0l4nd"/],
    [new Uint8Array([...RUNTIME, ...enc.encode("d3n0l4nd123")]), /ends before its metadata's/],
    [compiled("{}").subarray(0, -"sources and vfs".length - 1), /runs past the end/],
    [compiled("{nope"), /the metadata is not JSON/],
    [compiled("[1]"), /is not a JSON object/],
  ];
  for (const [bytes, message] of cases) assert.throws(() => readPayload(bytes, RUNTIME), message);
});

const FLAGS = [
  "--allow-run=/sbin/zfs,/bin/mount",
  "--allow-read=/csi,/sbin/zfs",
  "--allow-write=/csi",
  "--allow-net=s3.example.com:443",
  "--allow-env=CSI_ENDPOINT,PATH",
  "--allow-sys=statfs",
  "--no-prompt",
];
const BAKED = {
  allow_run: ["/sbin/zfs", "/bin/mount"],
  allow_read: ["/csi", "/sbin/zfs"],
  allow_write: ["/csi"],
  allow_net: ["s3.example.com:443"],
  allow_env: ["CSI_ENDPOINT", "PATH"],
  allow_sys: ["statfs"],
  allow_ffi: null,
  deny_read: null,
  allow_import: ["jsr.io:443", "deno.land:443"],
  prompt: false,
};

Deno.test("permissionMismatches: none when the metadata holds exactly the flags", () => {
  assert.deepEqual(permissionMismatches({ permissions: BAKED }, FLAGS), []);
});

Deno.test("permissionMismatches names a different list, a missing one and an unasked grant", () => {
  const baked = {
    ...BAKED,
    allow_write: ["/csi", "/"],
    allow_net: null,
    allow_ffi: [],
    allow_hrtime: true,
    prompt: true,
  };
  assert.deepEqual(permissionMismatches({ permissions: baked }, FLAGS), [
    'allow_write is ["/csi","/"], not ["/csi"]',
    'allow_net is null, not ["s3.example.com:443"]',
    "prompt is true, not false",
    "allow_hrtime grants true, which no flag asked for",
  ]);
  assert.deepEqual(permissionMismatches({}, ["--allow-sys=statfs"]), [
    'allow_sys is undefined, not ["statfs"]',
  ]);
  assert.throws(() => permissionMismatches({}, ["--allow-net"]), /Not a scoped permission flag/);
});

Deno.test("missingV8Flags: the flags of --v8-flags the metadata lacks", () => {
  const metadata = { v8_flags: ["ARG0", "--max-semi-space-size=1", "--max-old-space-size=128"] };
  assert.deepEqual(
    missingV8Flags(metadata, "--v8-flags=--max-semi-space-size=1,--max-old-space-size=128"),
    [],
  );
  assert.deepEqual(missingV8Flags({}, "--v8-flags=--max-old-space-size=128"), [
    "--max-old-space-size=128",
  ]);
  assert.throws(() => missingV8Flags(metadata, "--max-old-space-size=128"), /Not --v8-flags/);
});

Deno.test("missingBytes: the items whose bytes do not occur", () => {
  const rest = enc.encode("...export function a() {}\n...@grpc/grpc-js@1.14.7...");
  assert.deepEqual(
    missingBytes(
      rest,
      new Map([
        ["a.ts", enc.encode("export function a() {}\n")],
        ["b.ts", enc.encode("export function b() {}\n")],
        ["grpc", enc.encode("@grpc/grpc-js@1.14.7")],
      ]),
    ),
    ["b.ts"],
  );
});

Deno.test("codeFiles: local files reached by code imports, not by type-only ones", () => {
  const modules = [
    {
      specifier: "file:///r/main.ts",
      dependencies: [
        { code: { specifier: "file:///r/a.ts" } },
        { code: { specifier: "npm:/x@1.0.0" } },
        // `import type`: deno info lists it under "type", never "code".
        { type: { specifier: "file:///r/types.ts" } },
      ],
    },
    {
      specifier: "file:///r/a.ts",
      dependencies: [{ code: { specifier: "file:///r/main.ts" } }, {
        code: { specifier: "file:///r/d.json" },
      }],
    },
    { specifier: "file:///r/d.json" },
    { specifier: "file:///r/types.ts" },
    { specifier: "npm:/x@1.0.0" },
  ];
  assert.deepEqual(codeFiles(["file:///r/main.ts"], modules), [
    "file:///r/a.ts",
    "file:///r/d.json",
    "file:///r/main.ts",
  ]);
});
