import assert from "node:assert/strict";
import {
  describeForm,
  missingForReceive,
  parsePoolStreamSupport,
  parseZfsVersion,
  PLAIN_FORM,
  type PoolStreamSupport,
  sendFormFor,
  STREAM_HEADER_BYTES,
  streamHeaderFeatures,
} from "./stream_form.ts";

const fixture = (name: string) =>
  Deno.readTextFileSync(new URL(`../../tests/fixtures/${name}`, import.meta.url));

/** An OpenZFS 2.x pool with every feature a default `zpool create` enables. */
function openzfs(features: Record<string, string> = {}): PoolStreamSupport {
  return {
    pool: "tank",
    zfsVersion: "2.1.11",
    poolVersion: "-",
    features: new Map(Object.entries({
      lz4_compress: "active",
      embedded_data: "active",
      large_blocks: "enabled",
      large_dnode: "enabled",
      zstd_compress: "enabled",
      encryption: "enabled",
      ...features,
    })),
  };
}

/** The first 24 bytes of a stream: DRR_BEGIN, its magic and versioninfo, in either byte order. */
function header(flags: number, little = true, hdrType = 1): Uint8Array {
  const bytes = new Uint8Array(STREAM_HEADER_BYTES);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, 0, little);
  view.setUint32(4, 0, little);
  view.setBigUint64(8, 0x2f5bacbacn, little);
  view.setBigUint64(16, (BigInt(flags) << 2n) | BigInt(hdrType), little);
  return bytes;
}

Deno.test("parsePoolStreamSupport reads zfs-fuse's zpool get all: version 23, no features", () => {
  const support = parsePoolStreamSupport("tpool", fixture("zpool_get_all.txt"), undefined);
  assert.equal(support.poolVersion, "23");
  assert.equal(support.features.size, 0);
  assert.deepEqual(sendFormFor(support, { raw: false }), PLAIN_FORM);
});

Deno.test("parsePoolStreamSupport reads feature states, only of the pool asked about", () => {
  const out = [
    "NAME   PROPERTY                       VALUE                          SOURCE",
    "tank   size                           7.50G                          -",
    "tank   comment                        two words here                 local",
    "tank   version                        -                              default",
    "tank   feature@lz4_compress           active                         local",
    "tank   feature@large_blocks           enabled                        local",
    "tank   feature@embedded_data          disabled                       local",
    "tank2  feature@zstd_compress          active                         local",
    "",
  ].join("\n");
  const s = parsePoolStreamSupport("tank", out, "2.3.2");
  assert.equal(s.poolVersion, "-");
  assert.deepEqual(
    [...s.features],
    [["lz4_compress", "active"], ["large_blocks", "enabled"], ["embedded_data", "disabled"]],
  );
  assert.throws(() => parsePoolStreamSupport("other", out, "2.3.2"), /no version of pool "other"/);
});

Deno.test("parseZfsVersion reads the userland line of zfs version", () => {
  assert.equal(parseZfsVersion("zfs-2.1.11-1\nzfs-kmod-2.1.11-1\n"), "2.1.11");
  assert.equal(parseZfsVersion("zfs-2.3.2-2~bpo12+2\nzfs-kmod-2.3.2-2~bpo12+2\n"), "2.3.2");
  assert.equal(parseZfsVersion("something else\n"), undefined);
});

Deno.test("sendFormFor sends -c -L -e where the zfs and pool have them", () => {
  assert.deepEqual(sendFormFor(openzfs(), { raw: false }), {
    compressed: true,
    largeBlocks: true,
    embedded: true,
  });
  // A pool without the features: no -L, no -e; -c still (it needs no pool feature).
  const bare = openzfs({ large_blocks: "disabled", embedded_data: "disabled" });
  assert.deepEqual(sendFormFor(bare, { raw: false }), {
    compressed: true,
    largeBlocks: false,
    embedded: false,
  });
  // A zfs without `zfs version` (before 0.8): plain, as before.
  assert.deepEqual(
    sendFormFor({ ...openzfs(), zfsVersion: undefined }, { raw: false }),
    PLAIN_FORM,
  );
  // Raw sends (-w) carry the blocks as on disk already.
  assert.deepEqual(sendFormFor(openzfs(), { raw: true }), PLAIN_FORM);
});

Deno.test("sendFormFor keeps the -L of the chain an incremental continues", () => {
  const support = openzfs();
  // A chain sent plain (before forms, or from a node without the feature) stays without -L.
  assert.deepEqual(sendFormFor(support, { raw: false, base: PLAIN_FORM }), {
    compressed: true,
    largeBlocks: false,
    embedded: true,
  });
  // A chain sent with -L keeps it even where the pool would not choose it now.
  const base = { compressed: true, largeBlocks: true, embedded: true };
  const off = openzfs({ large_blocks: "disabled" });
  assert.equal(sendFormFor(off, { raw: false, base }).largeBlocks, true);
});

Deno.test("streamHeaderFeatures reads a stream's feature flags in either byte order", () => {
  // zfs-fuse 0.7.0's own stream of a snapshot (pool version 23): no feature flags.
  const fuse = Uint8Array.from([
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
    0xac,
    0xcb,
    0xba,
    0xf5,
    0x02,
    0x00,
    0x00,
    0x00,
    0x01,
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
    0x00,
  ]);
  assert.deepEqual(streamHeaderFeatures(fuse), []);
  const flags = (1 << 2) | (1 << 16) | (1 << 17) | (1 << 19) | (1 << 22);
  const want = ["compressed", "embed_data", "large_blocks", "lz4", "sa_spill"];
  assert.deepEqual(streamHeaderFeatures(header(flags)), want);
  assert.deepEqual(streamHeaderFeatures(header(flags, false)), want);
  assert.deepEqual(streamHeaderFeatures(header(1 << 29)), ["bit29"]);
});

Deno.test("streamHeaderFeatures refuses what is not the start of one stream", () => {
  assert.equal(streamHeaderFeatures(header(0).subarray(0, 23)), undefined);
  const notBegin = header(0);
  notBegin[0] = 3;
  assert.equal(streamHeaderFeatures(notBegin), undefined);
  const noMagic = header(0);
  noMagic[8] = 0;
  assert.equal(streamHeaderFeatures(noMagic), undefined);
  // zfs send -R: a compound stream.
  assert.equal(streamHeaderFeatures(header(0, true, 2)), undefined);
});

Deno.test("missingForReceive names what a pool lacks for a stream's features", () => {
  const form = {
    compressed: true,
    largeBlocks: true,
    embedded: true,
    features: ["compressed", "embed_data", "large_blocks", "lz4", "sa_spill"],
  };
  assert.deepEqual(missingForReceive(openzfs(), form), []);
  assert.deepEqual(
    missingForReceive(openzfs({ large_blocks: "disabled" }), form),
    ["feature@large_blocks (disabled; the stream has large_blocks)"],
  );
  const fuse = parsePoolStreamSupport("tpool", fixture("zpool_get_all.txt"), undefined);
  const [lacks, ...rest] = missingForReceive(fuse, form);
  assert.equal(rest.length, 0);
  assert.match(lacks!, /pool feature flags \(pool "tpool" is version 23/);
  assert.match(lacks!, /compressed, embed_data, large_blocks, lz4, sa_spill/);
  // A plain stream (or a manifest written before forms) needs nothing.
  assert.deepEqual(missingForReceive(fuse, { ...PLAIN_FORM, features: [] }), []);
  assert.deepEqual(missingForReceive(fuse, PLAIN_FORM), []);
  // Without the header's features, the flags stand for what they may bring.
  assert.equal(missingForReceive(fuse, { ...PLAIN_FORM, compressed: true }).length, 1);
  assert.deepEqual(
    missingForReceive(openzfs({ embedded_data: "disabled" }), { ...PLAIN_FORM, embedded: true }),
    ["feature@embedded_data (disabled; the stream has embed_data)"],
  );
});

Deno.test("describeForm says a form in words and flags", () => {
  assert.equal(describeForm(PLAIN_FORM, false), "plain stream (zfs send)");
  assert.equal(
    describeForm({ compressed: true, largeBlocks: true, embedded: true }, false),
    "compressed, large-block, embedded-data stream (zfs send -c -L -e)",
  );
  assert.equal(describeForm(PLAIN_FORM, true), "raw stream (zfs send -w)");
});
