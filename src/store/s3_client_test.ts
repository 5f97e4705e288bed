import assert from "node:assert/strict";
import { s3Url } from "./s3_client.ts";
import { canonicalPath, canonicalQuery } from "./sigv4.ts";

const aws = new URL("https://s3.eu-west-1.amazonaws.com");
const local = new URL("http://127.0.0.1:7070");

Deno.test("s3Url builds path-style URLs: endpoint/bucket/key", () => {
  const address = { endpoint: local, bucket: "backups", pathStyle: true };
  assert.equal(
    s3Url(address, "zfs-csi/v1/volumes/pg:data/volume.json").href,
    "http://127.0.0.1:7070/backups/zfs-csi/v1/volumes/pg%3Adata/volume.json",
  );
  assert.equal(s3Url(address, undefined).href, "http://127.0.0.1:7070/backups");
  // An endpoint with a path (behind a reverse proxy) keeps it, without doubled slashes.
  const proxied = { endpoint: new URL("https://gw.example/s3/"), bucket: "b", pathStyle: true };
  assert.equal(s3Url(proxied, "k").href, "https://gw.example/s3/b/k");
});

Deno.test("s3Url builds virtual-hosted URLs: bucket.endpoint/key", () => {
  const address = { endpoint: aws, bucket: "backups", pathStyle: false };
  assert.equal(
    s3Url(address, "zfs-csi/v1/a.json").href,
    "https://backups.s3.eu-west-1.amazonaws.com/zfs-csi/v1/a.json",
  );
  assert.equal(s3Url(address, undefined).href, "https://backups.s3.eu-west-1.amazonaws.com/");
  const port = { endpoint: new URL("http://minio.local:9000"), bucket: "b", pathStyle: false };
  assert.equal(s3Url(port, "k").href, "http://b.minio.local:9000/k");
});

Deno.test("s3Url encodes the query as SigV4 does, bare names as names", () => {
  const address = { endpoint: local, bucket: "b", pathStyle: true };
  const url = s3Url(address, undefined, [
    ["list-type", "2"],
    ["prefix", "zfs-csi/v1/a b+c"],
    ["continuation-token", "1ue/Gc+x=="],
  ]);
  assert.equal(
    url.search,
    "?list-type=2&prefix=zfs-csi%2Fv1%2Fa%20b%2Bc&continuation-token=1ue%2FGc%2Bx%3D%3D",
  );
  assert.equal(url.searchParams.get("continuation-token"), "1ue/Gc+x==");
  assert.equal(s3Url(address, "k", [["uploads", ""]]).search, "?uploads");
  // What goes on the wire is what gets signed: nothing for a server to decode differently.
  assert.equal(canonicalPath(url.pathname), url.pathname);
  assert.equal(
    canonicalQuery(url.search),
    "continuation-token=1ue%2FGc%2Bx%3D%3D&list-type=2&prefix=zfs-csi%2Fv1%2Fa%20b%2Bc",
  );
});
