import assert from "node:assert/strict";
import {
  amzDate,
  authorization,
  canonicalPath,
  canonicalQuery,
  canonicalRequest,
  EMPTY_SHA256,
  sha256Hex,
  signS3Request,
  stringToSign,
  uriEncode,
} from "./sigv4.ts";

// The example credentials, bucket and time of AWS's S3 documentation ("Signature Calculations
// for the Authorization Header: Transferring Payload in a Single Chunk", examples GET Object,
// PUT Object, GET Bucket Lifecycle, Get Bucket (List Objects)). The expected canonical request
// hashes and signatures below are the ones published there.
const AWS_EXAMPLE = {
  accessKeyId: "AKIAIOSFODNN7EXAMPLE",
  secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
};
const DATE = new Date("2013-05-24T00:00:00Z");
const SCOPE = { region: "us-east-1", service: "s3", date: DATE };
const BUCKET_URL = "https://examplebucket.s3.amazonaws.com";

function lastLine(s: string): string {
  return s.split("\n").at(-1) ?? "";
}

Deno.test("signS3Request gives the published signature of AWS's GET Object example", () => {
  const headers = signS3Request(
    {
      method: "GET",
      url: new URL(`${BUCKET_URL}/test.txt`),
      headers: { Range: "bytes=0-9" },
      payloadHash: EMPTY_SHA256,
      region: "us-east-1",
      date: DATE,
    },
    AWS_EXAMPLE,
  );
  assert.equal(
    headers.get("authorization"),
    "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request," +
      "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date," +
      "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
  );
  assert.equal(headers.get("x-amz-date"), "20130524T000000Z");
  assert.equal(headers.get("x-amz-content-sha256"), EMPTY_SHA256);
  assert.equal(headers.get("range"), "bytes=0-9");
  // fetch sets Host from the URL; a Host header of ours would be refused or doubled.
  assert.equal(headers.has("host"), false);
});

Deno.test("signS3Request trims header values and collapses inner spaces before signing", () => {
  const sign = (range: string) =>
    signS3Request(
      {
        method: "GET",
        url: new URL(`${BUCKET_URL}/test.txt`),
        headers: { Range: range },
        payloadHash: EMPTY_SHA256,
        region: "us-east-1",
        date: DATE,
      },
      AWS_EXAMPLE,
    ).get("authorization");
  const published = /Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41$/;
  assert.match(sign("  bytes=0-9 ") ?? "", published);
  const x = sign("a  b");
  assert.equal(x, sign("a b"));
});

Deno.test("canonicalRequest matches each step of AWS's GET Object example", () => {
  const input = {
    method: "GET",
    path: "/test.txt",
    query: "",
    headers: {
      Host: "examplebucket.s3.amazonaws.com",
      Range: "bytes=0-9",
      "x-amz-content-sha256": EMPTY_SHA256,
      "X-Amz-Date": "20130524T000000Z",
    },
    payloadHash: EMPTY_SHA256,
  };
  const canonical = canonicalRequest(input);
  assert.equal(
    canonical,
    [
      "GET",
      "/test.txt",
      "",
      "host:examplebucket.s3.amazonaws.com",
      "range:bytes=0-9",
      `x-amz-content-sha256:${EMPTY_SHA256}`,
      "x-amz-date:20130524T000000Z",
      "",
      "host;range;x-amz-content-sha256;x-amz-date",
      EMPTY_SHA256,
    ].join("\n"),
  );
  assert.equal(
    lastLine(stringToSign(canonical, SCOPE)),
    "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
  );
});

Deno.test("authorization gives the published signature of AWS's PUT Object example", () => {
  // The key "test$file.text" checks the path encoding ("$" is %24 in the canonical path) and
  // the Date and x-amz-storage-class headers check that every given header is signed.
  const body = "Welcome to Amazon S3.";
  const payloadHash = sha256Hex(body);
  assert.equal(payloadHash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  const headers = signS3Request(
    {
      method: "PUT",
      url: new URL(`${BUCKET_URL}/test$file.text`),
      headers: {
        Date: "Fri, 24 May 2013 00:00:00 GMT",
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
      },
      payloadHash,
      region: "us-east-1",
      date: DATE,
    },
    AWS_EXAMPLE,
  );
  assert.equal(
    headers.get("authorization"),
    "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request," +
      "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class," +
      "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd",
  );
  const canonical = canonicalRequest({
    method: "PUT",
    path: "/test$file.text",
    query: "",
    headers: {
      date: "Fri, 24 May 2013 00:00:00 GMT",
      host: "examplebucket.s3.amazonaws.com",
      "x-amz-content-sha256": payloadHash,
      "x-amz-date": "20130524T000000Z",
      "x-amz-storage-class": "REDUCED_REDUNDANCY",
    },
    payloadHash,
  });
  assert.equal(canonical.split("\n")[1], "/test%24file.text");
  assert.equal(
    lastLine(stringToSign(canonical, SCOPE)),
    "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d",
  );
});

Deno.test("signS3Request signs a bare query name as name= (AWS's GET Bucket Lifecycle)", () => {
  const headers = signS3Request(
    {
      method: "GET",
      url: new URL(`${BUCKET_URL}/?lifecycle`),
      payloadHash: EMPTY_SHA256,
      region: "us-east-1",
      date: DATE,
    },
    AWS_EXAMPLE,
  );
  assert.match(
    headers.get("authorization") ?? "",
    /,SignedHeaders=host;x-amz-content-sha256;x-amz-date,Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543$/,
  );
});

Deno.test("signS3Request sorts the query (AWS's Get Bucket (List Objects))", () => {
  // Sent in the other order on purpose: the canonical query is sorted by name.
  for (const query of ["prefix=J&max-keys=2", "max-keys=2&prefix=J", "prefix=%4A&max-keys=2"]) {
    const headers = signS3Request(
      {
        method: "GET",
        url: new URL(`${BUCKET_URL}/?${query}`),
        payloadHash: EMPTY_SHA256,
        region: "us-east-1",
        date: DATE,
      },
      AWS_EXAMPLE,
    );
    assert.match(
      headers.get("authorization") ?? "",
      /Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7$/,
      query,
    );
  }
  assert.equal(
    lastLine(stringToSign(
      canonicalRequest({
        method: "GET",
        path: "/",
        query: "prefix=J&max-keys=2",
        headers: {
          host: "examplebucket.s3.amazonaws.com",
          "x-amz-content-sha256": EMPTY_SHA256,
          "x-amz-date": "20130524T000000Z",
        },
        payloadHash: EMPTY_SHA256,
      }),
      SCOPE,
    )),
    "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7",
  );
});

Deno.test("authorization signs a session token (AWS test suite post-sts-header-before)", () => {
  // From AWS's SigV4 test suite (service "service", credentials AKIDEXAMPLE): the token is a
  // signed header.
  const token =
    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAe" +
    "MicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburE" +
    "Dy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZ" +
    "bqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";
  const auth = authorization(
    {
      method: "POST",
      path: "/",
      query: "",
      headers: {
        Host: "example.amazonaws.com",
        "X-Amz-Date": "20150830T123600Z",
        "X-Amz-Security-Token": token,
      },
      payloadHash: EMPTY_SHA256,
    },
    { region: "us-east-1", service: "service", date: new Date("2015-08-30T12:36:00Z") },
    { accessKeyId: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY" },
  );
  assert.match(
    auth,
    /SignedHeaders=host;x-amz-date;x-amz-security-token,Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead$/,
  );
});

Deno.test("signS3Request sends and signs x-amz-security-token only for temporary credentials", () => {
  const input = {
    method: "GET",
    url: new URL("http://127.0.0.1:7070/b/k"),
    payloadHash: EMPTY_SHA256,
    region: "us-east-1",
    date: DATE,
  };
  const plain = signS3Request(input, AWS_EXAMPLE);
  assert.equal(plain.has("x-amz-security-token"), false);
  const temp = signS3Request(input, { ...AWS_EXAMPLE, sessionToken: "tok" });
  assert.equal(temp.get("x-amz-security-token"), "tok");
  assert.match(
    temp.get("authorization") ?? "",
    /SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,/,
  );
  assert.notEqual(temp.get("authorization"), plain.get("authorization"));
});

Deno.test("signS3Request signs the host with its port, as fetch sends it", () => {
  const input = {
    method: "GET",
    payloadHash: EMPTY_SHA256,
    region: "us-east-1",
    date: DATE,
  };
  const a = signS3Request({ ...input, url: new URL("http://127.0.0.1:7070/b/k") }, AWS_EXAMPLE);
  const b = signS3Request({ ...input, url: new URL("http://127.0.0.1:7071/b/k") }, AWS_EXAMPLE);
  assert.notEqual(a.get("authorization"), b.get("authorization"));
  // A default port is not part of Host.
  const c = signS3Request({ ...input, url: new URL("https://h.example:443/b/k") }, AWS_EXAMPLE);
  const d = signS3Request({ ...input, url: new URL("https://h.example/b/k") }, AWS_EXAMPLE);
  assert.equal(c.get("authorization"), d.get("authorization"));
});

Deno.test("uriEncode keeps only unreserved bytes, unlike encodeURIComponent", () => {
  assert.equal(uriEncode("a-b_c.d~e09AZ"), "a-b_c.d~e09AZ");
  assert.equal(uriEncode("!'()*"), "%21%27%28%29%2A");
  assert.equal(uriEncode("a b+c=d:e"), "a%20b%2Bc%3Dd%3Ae");
  assert.equal(uriEncode("é"), "%C3%A9");
  assert.equal(uriEncode("a/b"), "a%2Fb");
  assert.equal(uriEncode("a/b", true), "a/b");
});

Deno.test("canonicalPath encodes each segment once and keeps the slashes", () => {
  assert.equal(
    canonicalPath("/bucket/v1/volumes/pg:data/a b"),
    "/bucket/v1/volumes/pg%3Adata/a%20b",
  );
  assert.equal(canonicalPath("/bucket/v1/pg%3Adata/a%20b"), "/bucket/v1/pg%3Adata/a%20b");
  assert.equal(canonicalPath(""), "/");
});

Deno.test("canonicalQuery sorts, encodes values with %20 and / as %2F, gives bare names =", () => {
  assert.equal(
    canonicalQuery("uploadId=a%2Fb%2Bc%3D%3D&partNumber=2"),
    "partNumber=2&uploadId=a%2Fb%2Bc%3D%3D",
  );
  assert.equal(canonicalQuery("?uploads"), "uploads=");
  assert.equal(
    canonicalQuery("list-type=2&prefix=v1/volumes/a b"),
    "list-type=2&prefix=v1%2Fvolumes%2Fa%20b",
  );
  assert.equal(canonicalQuery("a=2&a=1"), "a=1&a=2");
  assert.equal(canonicalQuery(""), "");
});

Deno.test("amzDate formats UTC without separators or milliseconds", () => {
  assert.equal(amzDate(new Date("2024-02-29T23:59:58.123Z")), "20240229T235958Z");
});
