/**
 * The HTTP/1.1 client (src/store/http1.ts) over real sockets, against tiny servers on 127.0.0.1
 * that write exactly the bytes each test gives them: split reads, chunked bodies, early closes,
 * error answers with bodies, keep-alive reuse, aborts, and requests it refuses to send. (Under
 * tests/integration/ because unit tests run without network permission.)
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Http1Client, Http1Error } from "../../src/store/http1.ts";
import { STEP_ASIDE_BYTES_PER_SECOND, volumeCalls } from "../../src/foreground.ts";

const encoder = new TextEncoder();
const latin1 = new TextDecoder("latin1");

/** A request as the server read it. */
interface SeenRequest {
  readonly head: string;
  readonly body: Uint8Array;
  /** Which connection (0-based, in accept order) carried it. */
  readonly connection: number;
}

/** What a connection's script can do: read the next request, write raw bytes, close. */
interface ServerSide {
  next(): Promise<SeenRequest | null>;
  write(text: string | Uint8Array): Promise<void>;
  close(): void;
}

/**
 * A server that runs `script` on each connection it accepts, with the connection's index.
 * Everything it opened is closed on dispose.
 */
class RawServer {
  readonly requests: SeenRequest[] = [];
  readonly #listener: Deno.Listener;
  readonly #conns: Deno.Conn[] = [];
  readonly #scripts: Promise<void>[] = [];
  readonly #accepting: Promise<void>;

  constructor(script: (side: ServerSide, index: number) => Promise<void>) {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.#listener = listener;
    this.#accepting = (async () => {
      for await (const conn of listener) {
        const index = this.#conns.length;
        this.#conns.push(conn);
        this.#scripts.push(
          script(this.#side(conn, index), index).catch(() => {}).finally(() => {
            try {
              conn.close();
            } catch {
              // Closed by the script.
            }
          }),
        );
      }
    })().catch(() => {});
  }

  get url(): string {
    return `http://127.0.0.1:${(this.#listener.addr as Deno.NetAddr).port}`;
  }

  get connections(): number {
    return this.#conns.length;
  }

  #side(conn: Deno.Conn, index: number): ServerSide {
    // Bytes read and not yet taken: buffer[0, filled), grown by doubling.
    let buffer = new Uint8Array(65536);
    let filled = 0;
    const more = async () => {
      if (filled === buffer.length) {
        const bigger = new Uint8Array(buffer.length * 2);
        bigger.set(buffer);
        buffer = bigger;
      }
      const n = await conn.read(buffer.subarray(filled));
      if (n === null) return false;
      filled += n;
      return true;
    };
    return {
      next: async () => {
        let end;
        while ((end = latin1.decode(buffer.subarray(0, filled)).indexOf("\r\n\r\n")) < 0) {
          if (!(await more())) return null;
        }
        const head = latin1.decode(buffer.subarray(0, end));
        const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? 0);
        while (filled < end + 4 + length) {
          if (!(await more())) return null;
        }
        const body = buffer.slice(end + 4, end + 4 + length);
        buffer.copyWithin(0, end + 4 + length, filled);
        filled -= end + 4 + length;
        const seen = { head, body, connection: index };
        this.requests.push(seen);
        return seen;
      },
      write: async (text) => {
        const bytes = typeof text === "string" ? encoder.encode(text) : text;
        for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
      },
      close: () => conn.close(),
    };
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#listener.close();
    for (const c of this.#conns) {
      try {
        c.close();
      } catch {
        // Closed by its script.
      }
    }
    await this.#accepting;
    await Promise.all(this.#scripts);
  }
}

/** Answers every request on a connection with `answer(request)`, until the client closes. */
function answering(answer: (r: SeenRequest) => string | Uint8Array) {
  return async (side: ServerSide) => {
    for (let r; (r = await side.next()) !== null;) await side.write(answer(r));
  };
}

function ok(body: string, extra = ""): string {
  return `HTTP/1.1 200 OK\r\ncontent-length: ${body.length}\r\n${extra}\r\n${body}`;
}

Deno.test("Http1Client reuses a kept-alive connection while held, and closes it after", async () => {
  await using server = new RawServer(answering((r) => ok(`you sent ${r.body.length}`)));
  const client = new Http1Client();
  {
    using _held = client.hold();
    for (let i = 0; i < 3; i++) {
      const r = await client.fetch(`${server.url}/k${i}`, {
        method: "PUT",
        body: new Uint8Array(i * 1000),
        headers: { "x-amz-date": "20260101T000000Z" },
      });
      assert.equal(r.status, 200);
      assert.equal(await r.text(), `you sent ${i * 1000}`);
    }
    assert.equal(server.connections, 1, "three requests over one connection");
    assert.equal(client.idleConnections, 1);
  }
  assert.equal(client.idleConnections, 0, "nothing kept open once nobody holds the client");
  assert.match(server.requests[1]!.head, /^PUT \/k1 HTTP\/1\.1\r\nhost: 127\.0\.0\.1:\d+\r\n/);
  assert.match(server.requests[1]!.head, /\r\nx-amz-date: 20260101T000000Z\r\n/);
  // Not held: each request's connection closes when its answer is read.
  await (await client.fetch(`${server.url}/a`)).text();
  await (await client.fetch(`${server.url}/b`)).text();
  assert.equal(server.connections, 3);
});

Deno.test("Http1Client parses heads and bodies split into single bytes", async () => {
  const answer = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: "e1"\r\n\r\n' +
    "5;ext=1\r\nhello\r\n1\r\n \r\nc\r\nworld, again\r\n0\r\nx-trailer: t\r\n\r\n";
  await using server = new RawServer(async (side) => {
    await side.next();
    for (const byte of encoder.encode(answer)) {
      await side.write(new Uint8Array([byte]));
      await new Promise((r) => setTimeout(r, 0));
    }
    await side.next();
  });
  const client = new Http1Client();
  using _held = client.hold();
  const r = await client.fetch(`${server.url}/x`);
  assert.equal(r.headers.get("etag"), '"e1"');
  assert.equal(await r.text(), "hello world, again");
  // The whole chunked body, trailers included, was read: the connection was kept.
  assert.equal(client.idleConnections, 1);
});

Deno.test("Http1Client gives 4xx and 5xx answers with their bodies, then reuses the connection", async () => {
  const xml = "<Error><Code>NoSuchKey</Code></Error>";
  await using server = new RawServer(
    answering((r) =>
      r.head.startsWith("GET /missing")
        ? `HTTP/1.1 404 Not Found\r\ncontent-length: ${xml.length}\r\n\r\n${xml}`
        : r.head.startsWith("GET /busy")
        ? "HTTP/1.1 503 Slow Down\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n"
        : ok("fine")
    ),
  );
  const client = new Http1Client();
  using _held = client.hold();
  const missing = await client.fetch(`${server.url}/missing`);
  assert.equal(missing.status, 404);
  assert.equal(missing.statusText, "Not Found");
  assert.equal(await missing.text(), xml);
  const busy = await client.fetch(`${server.url}/busy`);
  assert.equal(busy.status, 503);
  assert.equal(await busy.text(), "busy");
  assert.equal(await (await client.fetch(`${server.url}/ok`)).text(), "fine");
  assert.equal(server.connections, 1);
});

Deno.test("Http1Client fails a body cut short and does not reuse its connection", async () => {
  await using server = new RawServer(async (side, index) => {
    await side.next();
    if (index === 0) {
      await side.write("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b");
      return side.close();
    }
    await side.write(ok("second"));
    await side.next();
  });
  const client = new Http1Client();
  using _held = client.hold();
  const r = await client.fetch(`${server.url}/cut`);
  const error = await r.arrayBuffer().then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof Http1Error, String(error));
  assert.match(error.message, /closed with 90 bytes of the body to come/);
  assert.equal(await (await client.fetch(`${server.url}/next`)).text(), "second");
  assert.equal(server.connections, 2, "a new connection after the broken one");
});

Deno.test("Http1Client fails cut chunked bodies and answers that never came", async () => {
  await using server = new RawServer(async (side, index) => {
    await side.next();
    if (index === 0) {
      await side.write("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\nabc");
    }
    if (index === 1) await side.write("HTTP/1.1 200 OK\r\ncontent-le");
    side.close();
  });
  const client = new Http1Client();
  const r = await client.fetch(`${server.url}/chunked`);
  await assert.rejects(
    r.text(),
    (e: unknown) => e instanceof Http1Error && /inside a chunk/.test(e.message),
  );
  await assert.rejects(client.fetch(`${server.url}/half-head`), (e: unknown) => {
    assert.ok(e instanceof Http1Error);
    assert.match(e.message, /^GET http:\/\/127\.0\.0\.1:\d+ failed: .*middle of the answer/);
    assert.equal(e.answered, true);
    return true;
  });
  await assert.rejects(client.fetch(`${server.url}/nothing`), (e: unknown) => {
    assert.ok(e instanceof Http1Error);
    assert.match(e.message, /before any answer/);
    assert.equal(e.answered, false, "no byte came: the request may not have landed");
    return true;
  });
});

Deno.test("Http1Client refuses a broken answer: bad framing, bare LF, bytes before the request", async () => {
  const answers = [
    "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "HTTP/1.1 200 OK\ncontent-length: 0\n\n",
    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nab" + "extra bytes for nobody",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
  ];
  await using server = new RawServer(async (side, index) => {
    await side.next();
    await side.write(answers[index]!);
    await side.next();
  });
  const client = new Http1Client();
  using _held = client.hold();
  await assert.rejects(client.fetch(server.url), /both Transfer-Encoding and Content-Length/);
  await assert.rejects(client.fetch(server.url), /does not end in CRLF/);
  assert.equal(await (await client.fetch(server.url)).text(), "ab");
  // The bytes after that answer were no answer to the next request.
  await assert.rejects(client.fetch(server.url), /bytes nobody asked for/);
  const tooLong = await client.fetch(server.url);
  await assert.rejects(tooLong.text(), /a chunk is longer than its size says/);
  assert.equal(client.idleConnections, 0);
  assert.equal(server.connections, 4);
});

Deno.test("Http1Client honours Connection: close from either side, and skips 100 Continue", async () => {
  await using server = new RawServer(
    answering((r) =>
      r.head.includes("/server-closes")
        ? ok("bye", "connection: close\r\n")
        : r.head.includes("/continue")
        ? "HTTP/1.1 100 Continue\r\n\r\n" + ok("after continue")
        : ok("hi")
    ),
  );
  const client = new Http1Client();
  using _held = client.hold();
  assert.equal(await (await client.fetch(`${server.url}/server-closes`)).text(), "bye");
  assert.equal(client.idleConnections, 0);
  assert.equal(
    await (await client.fetch(`${server.url}/a`, { headers: { connection: "close" } })).text(),
    "hi",
  );
  assert.equal(client.idleConnections, 0);
  assert.equal(await (await client.fetch(`${server.url}/continue`)).text(), "after continue");
  assert.equal(client.idleConnections, 1);
  assert.equal(server.connections, 3);
});

Deno.test("Http1Client reads HEAD answers without a body and bodies that run to the close", async () => {
  await using server = new RawServer(async (side) => {
    let r;
    while ((r = await side.next()) !== null) {
      if (r.head.startsWith("HEAD")) {
        await side.write("HTTP/1.1 200 OK\r\ncontent-length: 12345\r\n\r\n");
      } else {
        await side.write("HTTP/1.1 200 OK\r\n\r\nuntil the end");
        return side.close();
      }
    }
  });
  const client = new Http1Client();
  using _held = client.hold();
  const head = await client.fetch(server.url, { method: "HEAD" });
  assert.equal(head.headers.get("content-length"), "12345");
  assert.equal(head.body, null);
  assert.equal(client.idleConnections, 1, "a HEAD answer ends with its head");
  assert.equal(await (await client.fetch(server.url)).text(), "until the end");
  assert.equal(client.idleConnections, 0);
  assert.equal(server.connections, 1);
});

Deno.test("Http1Client reuses a connection only after its answer was read to the end", async () => {
  await using server = new RawServer(answering(() => ok("x".repeat(300_000))));
  const client = new Http1Client();
  using _held = client.hold();
  const first = await client.fetch(server.url);
  const second = await client.fetch(server.url);
  assert.equal(server.connections, 2, "the first one's answer was still unread");
  await first.body!.cancel();
  assert.equal((await second.text()).length, 300_000);
  assert.equal(client.idleConnections, 1);
  await (await client.fetch(server.url)).text();
  assert.equal(server.connections, 2, "the fully read one was used again");
});

Deno.test("Http1Client: an abort ends the wait for an answer and a body midway", async () => {
  let release = () => {};
  const stalled = new Promise<void>((r) => release = r);
  await using server = new RawServer(async (side, index) => {
    await side.next();
    if (index === 1) await side.write("HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nfirst bytes");
    await stalled;
  });
  const client = new Http1Client();
  const before = new AbortController();
  const waiting = client.fetch(server.url, { signal: before.signal });
  setTimeout(() => before.abort(new Error("stop waiting")), 50);
  await assert.rejects(waiting, /stop waiting/);

  const during = new AbortController();
  const r = await client.fetch(server.url, { signal: during.signal });
  const reader = r.body!.getReader();
  assert.equal(latin1.decode((await reader.read()).value), "first bytes");
  const next = reader.read();
  during.abort(new Error("stop reading"));
  await assert.rejects(next, /stop reading/);
  // An aborted signal refuses before connecting at all.
  await assert.rejects(client.fetch(server.url, { signal: during.signal }), /stop reading/);
  assert.equal(server.connections, 2);
  release();
});

Deno.test("Http1Client refuses to send an injected header: nothing goes out", async () => {
  await using server = new RawServer(answering(() => ok("")));
  const client = new Http1Client();
  await assert.rejects(
    client.fetch(server.url, { headers: { "x-amz-meta-a": "1\r\nx-amz-acl: public-read" } }),
    TypeError,
  );
  await assert.rejects(client.fetch(server.url, { method: "GET / HTTP/1.1\r\n" }), TypeError);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(server.connections, 0);
});

Deno.test("Http1Client writes a large body as given and the server gets the same bytes", async () => {
  await using server = new RawServer(
    answering((r) => ok(createHash("sha256").update(r.body).digest("hex"))),
  );
  const body = new Uint8Array(24 * 1024 * 1024);
  for (let i = 0; i < body.length; i += 4096) body[i] = (i / 4096) % 251;
  const client = new Http1Client();
  const r = await client.fetch(`${server.url}/part`, { method: "PUT", body });
  assert.equal(await r.text(), createHash("sha256").update(body).digest("hex"));
});

Deno.test("Http1Client writes a body at the slow rate, in slices, while a volume call is served", async () => {
  await using server = new RawServer(answering(() => ok("done")));
  const client = new Http1Client();
  const body = new Uint8Array(8 * 1024 * 1024);
  let sent = 0;
  let largest = 0;
  let serving = true;
  const end = volumeCalls.begin({});
  const putting = client.fetch(`${server.url}/part`, {
    method: "PUT",
    body,
    onSent: (n) => {
      sent += n;
      if (serving) largest = Math.max(largest, n);
    },
  });
  await new Promise((r) => setTimeout(r, 200));
  const during = sent;
  serving = false;
  end();
  // The answer read first: a connection left with an unread answer would keep the server open.
  assert.equal(await (await putting).text(), "done");
  assert.ok(sent > body.length);
  assert.ok(largest <= 64 * 1024, `one write of ${largest} bytes while a call was served`);
  // 200 ms at the slow rate is 3.2 MiB (and the head); a socket on loopback takes 8 MiB at once.
  const most = 0.2 * STEP_ASIDE_BYTES_PER_SECOND + 64 * 1024;
  assert.ok(during <= most, `${during} bytes went out in 200 ms while a call was served`);
});

Deno.test("Http1Client: a refused connection is an Http1Error naming the endpoint", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  await assert.rejects(new Http1Client().fetch(`http://127.0.0.1:${port}/x`), (e: unknown) => {
    assert.ok(e instanceof Http1Error);
    assert.match(e.message, new RegExp(`^GET http://127\\.0\\.0\\.1:${port} failed: `));
    return true;
  });
});

Deno.test("Http1Client: an abort ends a body write to a server that reads nothing", async () => {
  let release = () => {};
  const stalled = new Promise<void>((r) => release = r);
  await using server = new RawServer(async () => await stalled);
  const client = new Http1Client();
  const abort = new AbortController();
  const body = new Uint8Array(64 * 1024 * 1024);
  const started = performance.now();
  setTimeout(() => abort.abort(new Error("stop writing")), 100);
  await assert.rejects(
    client.fetch(server.url, { method: "PUT", body, signal: abort.signal }),
    /stop writing/,
  );
  assert.ok(performance.now() - started < 5000, "the abort did not wait for the write");
  release();
});

Deno.test("Http1Client tells each write of a request as it goes out, and nothing once the server stops reading", async () => {
  await using server = new RawServer(answering(() => ok("done")));
  const client = new Http1Client();
  const body = new Uint8Array(24 * 1024 * 1024);
  let sent = 0;
  let writes = 0;
  const onSent = (n: number) => {
    sent += n;
    writes++;
  };
  const r = await client.fetch(`${server.url}/part`, { method: "PUT", body, onSent });
  assert.equal(await r.text(), "done");
  assert.ok(sent > body.length && writes >= 2, `${writes} writes, ${sent} bytes`);
  // A server that reads nothing: the socket takes what its buffers hold, then nothing more.
  let release = () => {};
  const stalled = new Promise<void>((r) => release = r);
  await using deaf = new RawServer(async () => await stalled);
  const abort = new AbortController();
  let told = 0;
  let last = 0;
  const telling = (n: number) => {
    told += n;
    last++;
  };
  const writing = client.fetch(deaf.url, {
    method: "PUT",
    body: new Uint8Array(256 * 1024 * 1024),
    signal: abort.signal,
    onSent: telling,
  });
  // Until the writes stop being told (the buffers are full), then a while longer.
  for (let seen = -1; seen !== last;) {
    seen = last;
    await new Promise((r) => setTimeout(r, 300));
  }
  const stoppedAt = told;
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(told, stoppedAt, "nothing told while nothing goes out");
  assert.ok(told < 256 * 1024 * 1024, `${told} bytes told of 256 MiB`);
  abort.abort(new Error("stalled"));
  await assert.rejects(writing, /stalled/);
  release();
});

/** A CA and a server certificate it signed for IP 127.0.0.1, made by openssl for this test. */
async function testCertificates(): Promise<{ ca: string; cert: string; key: string }> {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-http1-tls-" });
  const openssl = async (...args: string[]) => {
    const out = await new Deno.Command("openssl", { args, stdout: "null", stderr: "piped" })
      .output();
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
  };
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  try {
    await openssl(
      "req",
      "-x509",
      ...ec,
      "-days",
      "1",
      "-subj",
      "/CN=zfs-csi test CA",
      "-keyout",
      `${dir}/ca.key`,
      "-out",
      `${dir}/ca.pem`,
    );
    await openssl(
      "req",
      "-new",
      ...ec,
      "-subj",
      "/CN=127.0.0.1",
      "-keyout",
      `${dir}/key.pem`,
      "-out",
      `${dir}/req.csr`,
    );
    await Deno.writeTextFile(
      `${dir}/ext.cnf`,
      "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    );
    await openssl(
      "x509",
      "-req",
      "-in",
      `${dir}/req.csr`,
      "-CA",
      `${dir}/ca.pem`,
      "-CAkey",
      `${dir}/ca.key`,
      "-CAcreateserial",
      "-days",
      "1",
      "-extfile",
      `${dir}/ext.cnf`,
      "-out",
      `${dir}/cert.pem`,
    );
    return {
      ca: await Deno.readTextFile(`${dir}/ca.pem`),
      cert: await Deno.readTextFile(`${dir}/cert.pem`),
      key: await Deno.readTextFile(`${dir}/key.pem`),
    };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("Http1Client speaks https, checks the certificate, and reuses the TLS connection", async () => {
  const { ca, cert, key } = await testCertificates();
  const listener = Deno.listenTls({ hostname: "127.0.0.1", port: 0, cert, key });
  const url = `https://127.0.0.1:${listener.addr.port}`;
  let accepted = 0;
  const conns: Deno.Conn[] = [];
  const serving = (async () => {
    for await (const conn of listener) {
      accepted++;
      conns.push(conn);
      (async () => {
        const buffer = new Uint8Array(65536);
        let text = "";
        for (;;) {
          const n = await conn.read(buffer).catch(() => null);
          if (n === null) break;
          text += latin1.decode(buffer.subarray(0, n));
          while (text.includes("\r\n\r\n")) {
            text = text.slice(text.indexOf("\r\n\r\n") + 4);
            await conn.write(encoder.encode(ok("over tls")));
          }
        }
        conn.close();
      })().catch(() => {});
    }
  })().catch(() => {});
  try {
    const untrusting = new Http1Client();
    await assert.rejects(untrusting.fetch(url), (e: unknown) => {
      assert.ok(e instanceof Http1Error, String(e));
      assert.match(e.message, /^GET https:\/\/127\.0\.0\.1:\d+ failed: /);
      return true;
    });
    const client = new Http1Client({ caCerts: [ca] });
    using _held = client.hold();
    assert.equal(await (await client.fetch(`${url}/a`)).text(), "over tls");
    assert.equal(await (await client.fetch(`${url}/b`)).text(), "over tls");
    assert.equal(accepted, 2, "one refused handshake, then one connection for both requests");
  } finally {
    listener.close();
    await serving;
    for (const c of conns) {
      try {
        c.close();
      } catch {
        // Closed by its reader.
      }
    }
  }
});

Deno.test("Http1Client does not reuse a connection idle for longer than maxIdleMs", async () => {
  await using server = new RawServer(answering(() => ok("x")));
  const client = new Http1Client({ maxIdleMs: 50 });
  using _held = client.hold();
  await (await client.fetch(server.url)).text();
  await (await client.fetch(server.url)).text();
  assert.equal(server.connections, 1, "reused while fresh");
  await new Promise((r) => setTimeout(r, 120));
  await (await client.fetch(server.url)).text();
  assert.equal(server.connections, 2, "a new connection after the idle limit");
  assert.equal(client.idleConnections, 1);
});

Deno.test("Http1Client: a body that comes in small pieces gives chunks holding only their bytes", async () => {
  // A slow network hands a download over in small segments; a chunk its reader holds on to (a
  // restore holds back the last one) must not keep a large read buffer.
  const pieces = 50;
  const rest = 2 * 1024 * 1024;
  await using server = new RawServer(async (side) => {
    await side.next();
    await side.write(`HTTP/1.1 200 OK\r\ncontent-length: ${pieces * 100 + rest}\r\n\r\n`);
    for (let i = 0; i < pieces; i++) {
      await side.write(new Uint8Array(100).fill(i));
      await new Promise((r) => setTimeout(r, 2));
    }
    await side.write(new Uint8Array(rest));
    await side.next();
  });
  const client = new Http1Client();
  const r = await client.fetch(`${server.url}/x`);
  let bytes = 0;
  for await (const chunk of r.body!) {
    bytes += chunk.length;
    assert.ok(
      chunk.buffer.byteLength <= Math.max(2 * chunk.length, 64 * 1024),
      `a chunk of ${chunk.length} bytes holds a buffer of ${chunk.buffer.byteLength}`,
    );
  }
  assert.equal(bytes, pieces * 100 + rest);
});

Deno.test("Http1Client reads a body into a BYOB reader's buffers, whatever its framing", async () => {
  const text = "0123456789".repeat(20_000);
  const chunked = `${(100_000).toString(16)}\r\n${text.slice(0, 100_000)}\r\n` +
    `${(100_000).toString(16)}\r\n${text.slice(100_000)}\r\n0\r\n\r\n`;
  await using server = new RawServer(async (side) => {
    await side.next();
    await side.write(ok(text));
    await side.next();
    await side.write(`HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n${chunked}`);
    await side.next();
    await side.write(`HTTP/1.1 200 OK\r\n\r\n${text}`);
    side.close();
  });
  const client = new Http1Client();
  using _held = client.hold();
  for (const framing of ["length", "chunked", "to the close"]) {
    const reader = (await client.fetch(`${server.url}/${framing}`)).body!.getReader({
      mode: "byob",
    });
    let buffer = new Uint8Array(16 * 1024);
    let got = "";
    for (;;) {
      const r = await reader.read(buffer);
      if (r.done) break;
      assert.equal(r.value.buffer.byteLength, 16 * 1024, `${framing}: the reader's own buffer`);
      got += latin1.decode(r.value);
      buffer = new Uint8Array(r.value.buffer);
    }
    assert.equal(got, text, framing);
  }
  assert.equal(server.connections, 1);
});
