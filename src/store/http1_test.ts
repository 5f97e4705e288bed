// The HTTP/1.1 client's pure parts: the request head it writes and the answer heads it accepts.
// Its behaviour over real sockets is tested in tests/integration/http1_test.ts (unit tests run
// without network permission).

import assert from "node:assert/strict";
import { Http1Error, parseAnswerHead, parseChunkSize, requestHead } from "./http1.ts";

const url = new URL("http://127.0.0.1:7070/bucket/a%20b?partNumber=2&uploadId=x");
const latin1 = new TextDecoder("latin1");

Deno.test("requestHead writes the request line, host, headers and content-length", () => {
  const body = new Uint8Array(5);
  const { bytes, close } = requestHead(url, "PUT", { "X-Amz-Date": "20260101T000000Z" }, body);
  assert.equal(
    latin1.decode(bytes),
    "PUT /bucket/a%20b?partNumber=2&uploadId=x HTTP/1.1\r\nhost: 127.0.0.1:7070\r\n" +
      "x-amz-date: 20260101T000000Z\r\ncontent-length: 5\r\n\r\n",
  );
  assert.equal(close, false);
  // A POST without a body still says so; a GET says nothing.
  assert.match(latin1.decode(requestHead(url, "POST", undefined, null).bytes), /length: 0\r\n/);
  assert.doesNotMatch(latin1.decode(requestHead(url, "GET", undefined, null).bytes), /length/);
});

Deno.test("requestHead refuses header injection and what the client sets itself", () => {
  const refused: [string, HeadersInit | undefined][] = [
    ["GET", { "x-a": "1\r\nx-injected: 2" }],
    ["GET", { "x-a": "1\nGET /other HTTP/1.1" }],
    ["GET", { "x-a": "nul\0" }],
    ["GET", [["x a", "1"]]],
    ["GET", [["x-a:", "1"]]],
    ["GET", { host: "elsewhere" }],
    ["GET", { "content-length": "3" }],
    ["GET", { "transfer-encoding": "chunked" }],
    ["GET /x HTTP/1.1\r\nHost: y\r\n\r\nGET", undefined],
    ["", undefined],
  ];
  for (const [method, headers] of refused) {
    assert.throws(() => requestHead(url, method, headers, null), TypeError, `${method} ${headers}`);
  }
  assert.throws(() => requestHead(new URL("ftp://h/x"), "GET", undefined, null), TypeError);
  assert.throws(() => requestHead(new URL("http://u:p@h/x"), "GET", undefined, null), TypeError);
});

Deno.test("requestHead notes a request's Connection: close", () => {
  assert.equal(requestHead(url, "GET", { connection: "Close" }, null).close, true);
  assert.equal(requestHead(url, "GET", { connection: "keep-alive" }, null).close, false);
});

Deno.test("parseAnswerHead reads status, headers and the body's framing", () => {
  const head = parseAnswerHead([
    "HTTP/1.1 200 OK",
    'ETag: "abc"',
    "Content-Length:  42 ",
    "X-Multi: a",
    "X-Multi: b",
  ], "GET");
  assert.notEqual(head, "interim");
  if (head === "interim") return;
  assert.equal(head.init.status, 200);
  assert.equal(head.init.statusText, "OK");
  assert.equal(new Headers(head.init.headers).get("etag"), '"abc"');
  assert.equal(new Headers(head.init.headers).get("x-multi"), "a, b");
  assert.deepEqual(head.framing, { kind: "length", length: 42 });
  assert.equal(head.keepAlive, true);
});

Deno.test("parseAnswerHead picks the framing a server means", () => {
  const framing = (lines: string[], method = "GET") => {
    const h = parseAnswerHead(lines, method);
    return h === "interim" ? "interim" : [h.framing.kind, h.keepAlive];
  };
  assert.deepEqual(framing(["HTTP/1.1 200 OK", "Transfer-Encoding: Chunked"]), ["chunked", true]);
  assert.deepEqual(framing(["HTTP/1.1 200 OK"]), ["close", false]);
  assert.deepEqual(framing(["HTTP/1.1 200 OK", "Content-Length: 0"]), ["none", true]);
  assert.deepEqual(framing(["HTTP/1.1 200 OK", "Content-Length: 9"], "HEAD"), ["none", true]);
  assert.deepEqual(framing(["HTTP/1.1 204 No Content"]), ["none", true]);
  assert.deepEqual(framing(["HTTP/1.1 304 Not Modified"]), ["none", true]);
  assert.deepEqual(framing(["HTTP/1.1 200 OK", "Content-Length: 3", "Connection: close"]), [
    "length",
    false,
  ]);
  assert.deepEqual(framing(["HTTP/1.0 200 OK", "Content-Length: 3"]), ["length", false]);
  assert.deepEqual(framing(["HTTP/1.0 200 OK", "Content-Length: 3", "Connection: keep-alive"]), [
    "length",
    true,
  ]);
  // Repeated Content-Length values that agree are one length.
  assert.deepEqual(framing(["HTTP/1.1 200 OK", "Content-Length: 3, 3"]), ["length", true]);
  assert.equal(framing(["HTTP/1.1 100 Continue"]), "interim");
  // An empty reason phrase is allowed.
  assert.deepEqual(framing(["HTTP/1.1 404 ", "Content-Length: 1"]), ["length", true]);
  assert.deepEqual(framing(["HTTP/1.1 503", "Content-Length: 1"]), ["length", true]);
});

Deno.test("parseAnswerHead refuses what an HTTP/1.1 server would not send", () => {
  const bad: string[][] = [
    [],
    ["HTTP/2 200 OK"],
    ["HTTP/1.1 20 OK"],
    ["HTTP/1.1 2000 OK"],
    ["http/1.1 200 OK"],
    ["HTTP/1.1 200 OK", "Bad Name: x"],
    ["HTTP/1.1 200 OK", ": no name"],
    ["HTTP/1.1 200 OK", "no-colon"],
    ["HTTP/1.1 200 OK", "X-Ctl: a\x01b"],
    ["HTTP/1.1 200 OK", "Content-Length: 3", "Content-Length: 4"],
    ["HTTP/1.1 200 OK", "Content-Length: -1"],
    ["HTTP/1.1 200 OK", "Content-Length: 0x10"],
    ["HTTP/1.1 200 OK", "Content-Length: 3", "Transfer-Encoding: chunked"],
    ["HTTP/1.1 200 OK", "Transfer-Encoding: gzip, chunked"],
    ["HTTP/1.1 101 Switching Protocols"],
    ["HTTP/1.1 200 OK", ...Array.from({ length: 200 }, (_, i) => `x-${i}: y`)],
  ];
  for (const lines of bad) {
    assert.throws(() => parseAnswerHead(lines, "GET"), Http1Error, JSON.stringify(lines));
  }
});

Deno.test("parseChunkSize reads hex sizes and skips extensions", () => {
  assert.equal(parseChunkSize("0"), 0);
  assert.equal(parseChunkSize("1aF"), 0x1af);
  assert.equal(parseChunkSize("10;name=value"), 16);
  assert.equal(parseChunkSize("10 ;ext"), 16);
  for (const bad of ["", "x", "-1", " 10", "1 2", "1234567890abc"]) {
    assert.throws(() => parseChunkSize(bad), Http1Error, bad);
  }
});
