import assert from "node:assert/strict";
import { answer } from "./endpoint.ts";

const scrape = () => Promise.resolve("up 1\n");

Deno.test("answer serves GET /metrics in the text format", async () => {
  const r = await answer(new Request("http://h/metrics"), scrape);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  assert.equal(await r.text(), "up 1\n");
  const head = await answer(new Request("http://h/metrics", { method: "HEAD" }), scrape);
  assert.equal(head.status, 200);
  assert.equal(await head.text(), "");
});

Deno.test("answer refuses other paths and methods without scraping", async () => {
  let scrapes = 0;
  const counted = () => (scrapes++, scrape());
  const other = await answer(new Request("http://h/"), counted);
  assert.equal(other.status, 404);
  await other.body?.cancel();
  const post = await answer(new Request("http://h/metrics", { method: "POST" }), counted);
  assert.equal(post.status, 405);
  assert.equal(post.headers.get("allow"), "GET, HEAD");
  await post.body?.cancel();
  assert.equal(scrapes, 0);
});
