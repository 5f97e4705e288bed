import assert from "node:assert/strict";
import {
  completeMultipartUploadXml,
  parseCompleteMultipartUpload,
  parseErrorBody,
  parseInitiateMultipartUpload,
  parseListObjectsV2,
  parseXml,
  unquoteEtag,
} from "./s3_xml.ts";

const LIST_PAGE = `<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>backups</Name>
  <Prefix>zfs-csi/v1/</Prefix>
  <KeyCount>2</KeyCount>
  <MaxKeys>1000</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents>
    <Key>zfs-csi/v1/volumes/a/volume.json</Key>
    <LastModified>2024-05-01T10:00:00.000Z</LastModified>
    <ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag>
    <Size>412</Size>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
  <Contents>
    <Key>zfs-csi/v1/volumes/a&amp;b/streams/x.zfs</Key>
    <ETag>"3858f62230ac3c915f300c664312c11f-9"</ETag>
    <Size>41943163</Size>
  </Contents>
</ListBucketResult>`;

Deno.test("parseListObjectsV2 reads keys, sizes, unquoted etags, times and the continuation token", () => {
  assert.deepEqual(parseListObjectsV2(LIST_PAGE), {
    objects: [
      {
        key: "zfs-csi/v1/volumes/a/volume.json",
        size: 412,
        etag: "9b2cf535f27731c974343645a3985328",
        lastModifiedMs: Date.UTC(2024, 4, 1, 10),
      },
      {
        key: "zfs-csi/v1/volumes/a&b/streams/x.zfs",
        size: 41943163,
        etag: "3858f62230ac3c915f300c664312c11f-9",
      },
    ],
    nextContinuationToken: "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=",
  });
});

Deno.test("parseListObjectsV2 reads LastModified as S3 writes it, and leaves out any other", () => {
  const timeOf = (text: string) => {
    const xml = `<ListBucketResult><Contents><Key>k</Key><Size>1</Size>` +
      `<LastModified>${text}</LastModified></Contents></ListBucketResult>`;
    return parseListObjectsV2(xml).objects[0]!.lastModifiedMs;
  };
  const at = Date.UTC(2024, 4, 1, 10, 0, 7);
  assert.equal(timeOf("2024-05-01T10:00:07.000Z"), at);
  assert.equal(timeOf("2024-05-01T10:00:07Z"), at);
  assert.equal(timeOf(" 2024-05-01T10:00:07.250Z "), at + 250);
  assert.equal(timeOf("2024-05-01T10:00:07.123456789Z"), at + 123);
  assert.equal(timeOf("2024-05-01T12:00:07+02:00"), at);
  for (
    const bad of [
      "",
      "yesterday",
      "2024-05-01",
      "2024-05-01T10:00:07", // no zone: whose clock?
      "Wed, 01 May 2024 10:00:07 GMT",
      "2024-13-45T10:00:07Z",
      "1714557607000",
    ]
  ) {
    assert.equal(timeOf(bad), undefined, bad);
  }
});

Deno.test("parseListObjectsV2 reads a last or empty page without a token", () => {
  const empty = `<ListBucketResult><Name>b</Name><KeyCount>0</KeyCount>` +
    `<IsTruncated>false</IsTruncated></ListBucketResult>`;
  assert.deepEqual(parseListObjectsV2(empty), { objects: [] });
  // A token on a page that is not truncated is ignored.
  const last = LIST_PAGE.replace("<IsTruncated>true", "<IsTruncated>false");
  assert.equal(parseListObjectsV2(last).nextContinuationToken, undefined);
});

Deno.test("parseListObjectsV2 refuses what is not a usable listing", () => {
  for (
    const xml of [
      "<Error><Code>AccessDenied</Code></Error>",
      "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
      "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
      "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",
      "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
      "<html><body>Bad gateway</body></html>",
      "not xml",
      "<ListBucketResult><Contents>",
    ]
  ) {
    assert.throws(() => parseListObjectsV2(xml), SyntaxError, xml);
  }
});

Deno.test("parseInitiateMultipartUpload gives the upload id", () => {
  const xml = `<?xml version="1.0" encoding="UTF-8"?>
<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>backups</Bucket><Key>zfs-csi/x.zfs</Key>
  <UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId>
</InitiateMultipartUploadResult>`;
  assert.equal(
    parseInitiateMultipartUpload(xml),
    "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA",
  );
  assert.throws(
    () => parseInitiateMultipartUpload("<InitiateMultipartUploadResult/>"),
    SyntaxError,
  );
});

Deno.test("parseCompleteMultipartUpload tells a result from an <Error> sent with 200", () => {
  const ok = `<?xml version="1.0" encoding="UTF-8"?>\n<CompleteMultipartUploadResult>` +
    `<Location>http://x</Location><Bucket>b</Bucket><Key>k</Key>` +
    `<ETag>"3858f62230ac3c915f300c664312c11f-9"</ETag></CompleteMultipartUploadResult>`;
  assert.deepEqual(parseCompleteMultipartUpload(ok), {
    etag: "3858f62230ac3c915f300c664312c11f-9",
  });
  // S3 sends 200 first and the outcome later, with whitespace to keep the connection open.
  const failed =
    `<?xml version="1.0" encoding="UTF-8"?>\n\n   \n<Error><Code>InternalError</Code>` +
    `<Message>We encountered an internal error. Please try again.</Message></Error>`;
  assert.deepEqual(parseCompleteMultipartUpload(failed), {
    error: {
      code: "InternalError",
      message: "We encountered an internal error. Please try again.",
    },
  });
  assert.throws(() => parseCompleteMultipartUpload("<Other/>"), SyntaxError);
});

Deno.test("parseErrorBody keeps only the code and the message", () => {
  const xml = `<?xml version="1.0" encoding="UTF-8"?>
<Error>
  <Code>SignatureDoesNotMatch</Code>
  <Message>The request signature we calculated does not match the signature you provided.</Message>
  <AWSAccessKeyId>AKIAIOSFODNN7EXAMPLE</AWSAccessKeyId>
  <StringToSign>AWS4-HMAC-SHA256 20130524T000000Z ...</StringToSign>
  <SignatureProvided>f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41</SignatureProvided>
  <RequestId>4442587FB7D0A2F9</RequestId>
</Error>`;
  assert.deepEqual(parseErrorBody(xml), {
    code: "SignatureDoesNotMatch",
    message: "The request signature we calculated does not match the signature you provided.",
  });
  assert.equal(parseErrorBody(""), undefined);
  assert.equal(parseErrorBody("<html><body>502 Bad Gateway</body></html>"), undefined);
  assert.equal(parseErrorBody("Service Unavailable"), undefined);
});

Deno.test("parseXml decodes entities, CDATA and namespace prefixes, and skips comments", () => {
  const root = parseXml(
    `<?xml version="1.0"?><!-- a comment --><s3:R xmlns:s3="x"><A>1 &lt; 2 &amp;&#65;&#x42;</A>` +
      `<B><![CDATA[<raw> & text]]></B><C/><D attr="v">d</D></s3:R>`,
  );
  assert.equal(root.name, "R");
  assert.deepEqual(root.children.map((c) => [c.name, c.text]), [
    ["A", "1 < 2 &AB"],
    ["B", "<raw> & text"],
    ["C", ""],
    ["D", "d"],
  ]);
  assert.throws(() => parseXml("<a><b></a>"), SyntaxError);
  assert.throws(() => parseXml("<a></a><b></b>"), SyntaxError);
  assert.throws(() => parseXml(""), SyntaxError);
});

Deno.test("completeMultipartUploadXml lists the parts in order with quoted etags", () => {
  assert.equal(
    completeMultipartUploadXml(["aaa", "bbb"]),
    `<?xml version="1.0" encoding="UTF-8"?>\n` +
      `<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">` +
      `<Part><PartNumber>1</PartNumber><ETag>&quot;aaa&quot;</ETag></Part>` +
      `<Part><PartNumber>2</PartNumber><ETag>&quot;bbb&quot;</ETag></Part>` +
      `</CompleteMultipartUpload>`,
  );
  // What we send, S3 reads back the same way.
  const parsed = parseXml(completeMultipartUploadXml(["a&b"]));
  assert.equal(parsed.children[0]?.children[1]?.text, '"a&b"');
});

Deno.test("unquoteEtag strips one pair of quotes and nothing else", () => {
  assert.equal(unquoteEtag('"abc"'), "abc");
  assert.equal(unquoteEtag("abc"), "abc");
  assert.equal(unquoteEtag(' "abc-2" '), "abc-2");
  assert.equal(unquoteEtag('"'), '"');
});
