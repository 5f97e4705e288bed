import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import { keyOfToken, paginate, tokenAfter } from "./paging.ts";

function assertAborted(token: string): void {
  assertThrowsCsi(
    () => keyOfToken(token),
    Code.ABORTED,
    `starting_token "${token}" is not valid; list from the start`,
  );
}

const KEYS = ["a", "b", "c", "d", "e", "f", "g"];
const key = (s: string) => s;

Deno.test("tokenAfter writes the key as unpadded base64url after a prefix", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["a", "after:YQ"],
    ["pg@node-a", "after:cGdAbm9kZS1h"],
    ["日本", "after:5pel5pys"],
    // U+FFFF is EF BF BF, which base64 writes as "77+/": "+" and "/" become "-" and "_".
    ["\uffff", "after:77-_"],
  ];
  for (const [k, token] of table) assert.equal(tokenAfter(k), token, k);
});

Deno.test("keyOfToken reverses tokenAfter, non-ASCII keys included", () => {
  const keys = [
    "a",
    "pg@node-a",
    "db[0]@before upgrade@node-a",
    "日本語 ボリューム",
    "x🙂y",
    "\uffff",
    "é",
    "ab",
    "abc",
    "x".repeat(300),
  ];
  for (const k of keys) {
    const token = tokenAfter(k);
    assert.match(token, /^after:[A-Za-z0-9_-]+$/, k);
    assert.equal(keyOfToken(token), k, token);
  }
});

Deno.test("keyOfToken refuses tokens it did not make with ABORTED naming the token", () => {
  const table = [
    "invalid-token",
    "after:",
    "after:!!",
    "after:YQ==", // padded
    "after:YQ=",
    "after:Y", // a length no base64 has
    "after:YR", // decodes to "a" too, but is not what tokenAfter writes
    "after:77+/", // base64, not base64url
    "after:_w", // byte 0xff: not UTF-8
    "after: YQ",
    "after:YQ\n",
    "AFTER:YQ",
    "before:YQ",
    "YQ",
    "",
  ];
  for (const token of table) assertAborted(token);
});

Deno.test("keyOfToken refuses a tampered token", () => {
  const token = tokenAfter("pg@node-a");
  assert.equal(keyOfToken(token), "pg@node-a");
  assertAborted(token.slice(0, -1));
  assertAborted(token + "A");
  assertAborted(token.replace("after:", "after:x"));
});

Deno.test("paginate pages cover every entry exactly once, in key order, for any page size", () => {
  const items = ["e", "a", "g", "c", "b", "f", "d"].map((k) => ({ k }));
  for (let max = 1; max <= items.length + 1; max++) {
    const seen: string[] = [];
    let token = "";
    let pages = 0;
    do {
      const page = paginate(items, (i) => i.k, { maxEntries: max, startingToken: token });
      assert.ok(page.entries.length <= max, `page of ${page.entries.length} > ${max}`);
      seen.push(...page.entries.map((i) => i.k));
      token = page.nextToken;
      pages++;
      assert.ok(pages <= items.length + 1, "paging does not end");
    } while (token !== "");
    assert.deepEqual(seen, KEYS, `max_entries ${max}`);
    assert.equal(pages, Math.ceil(items.length / max), `pages for max_entries ${max}`);
  }
});

Deno.test("paginate returns the exact pages and tokens", () => {
  const first = paginate(KEYS, key, { maxEntries: 3 });
  assert.deepEqual(first, { entries: ["a", "b", "c"], nextToken: tokenAfter("c") });
  const second = paginate(KEYS, key, { maxEntries: 3, startingToken: first.nextToken });
  assert.deepEqual(second, { entries: ["d", "e", "f"], nextToken: tokenAfter("f") });
  const last = paginate(KEYS, key, { maxEntries: 3, startingToken: second.nextToken });
  assert.deepEqual(last, { entries: ["g"], nextToken: "" });
});

Deno.test("paginate gives an empty next_token on a last page that is exactly full", () => {
  const first = paginate(["a", "b", "c", "d"], key, { maxEntries: 2 });
  assert.deepEqual(first, { entries: ["a", "b"], nextToken: tokenAfter("b") });
  assert.deepEqual(
    paginate(["a", "b", "c", "d"], key, { maxEntries: 2, startingToken: first.nextToken }),
    { entries: ["c", "d"], nextToken: "" },
  );
  assert.deepEqual(paginate(["a", "b"], key, { maxEntries: 2 }), {
    entries: ["a", "b"],
    nextToken: "",
  });
});

Deno.test("paginate returns everything when max_entries is 0 or unset", () => {
  const items = ["c", "a", "b"];
  const all = { entries: ["a", "b", "c"], nextToken: "" };
  assert.deepEqual(paginate(items, key, { maxEntries: 0 }), all);
  assert.deepEqual(paginate(items, key, {}), all);
  assert.deepEqual(paginate(items, key, { startingToken: "" }), all);
  assert.deepEqual(paginate(items, key, { maxEntries: 0, startingToken: tokenAfter("a") }), {
    entries: ["b", "c"],
    nextToken: "",
  });
  // The input is left as it was.
  assert.deepEqual(items, ["c", "a", "b"]);
});

Deno.test("paginate of nothing is one empty last page", () => {
  assert.deepEqual(paginate([], key, { maxEntries: 5 }), { entries: [], nextToken: "" });
  assert.deepEqual(paginate(["a"], key, { maxEntries: 5, startingToken: tokenAfter("a") }), {
    entries: [],
    nextToken: "",
  });
});

Deno.test("paginate refuses a negative or fractional max_entries with INVALID_ARGUMENT", () => {
  for (const maxEntries of [-1, -100, 1.5, Number.NaN]) {
    assertThrowsCsi(
      () => paginate(KEYS, key, { maxEntries }),
      Code.INVALID_ARGUMENT,
      "max_entries must not be negative",
    );
  }
});

Deno.test("paginate refuses a bad starting_token with ABORTED, even for an empty list", () => {
  for (const items of [KEYS, []]) {
    assertThrowsCsi(
      () => paginate(items, key, { maxEntries: 2, startingToken: "after:!!" }),
      Code.ABORTED,
      'starting_token "after:!!" is not valid; list from the start',
    );
  }
});

Deno.test("paginate resumes after a token whose entry was deleted", () => {
  const first = paginate(KEYS, key, { maxEntries: 2 });
  assert.deepEqual(first.entries, ["a", "b"]);
  // "b" (the token's entry) and "c" go away, "bb" appears after it and "aa" before it.
  const now = ["a", "aa", "bb", "d", "e", "f", "g"];
  assert.deepEqual(paginate(now, key, { maxEntries: 2, startingToken: first.nextToken }), {
    entries: ["bb", "d"],
    nextToken: tokenAfter("d"),
  });
  // A token after the last entry, which is gone now, ends the listing.
  assert.deepEqual(paginate(["a", "b"], key, { maxEntries: 2, startingToken: tokenAfter("z") }), {
    entries: [],
    nextToken: "",
  });
});

Deno.test("paginate orders by key, not by the item's position", () => {
  const items = [
    { id: "vol-2@node-a", n: 0 },
    { id: "db[0]@node-a", n: 1 },
    { id: "vol-10@node-a", n: 2 },
    { id: "日本@node-a", n: 3 },
  ];
  const page = paginate(items, (i) => i.id, { maxEntries: 3 });
  assert.deepEqual(page.entries.map((i) => i.n), [1, 2, 0]);
  assert.equal(page.nextToken, tokenAfter("vol-2@node-a"));
  const rest = paginate(items, (i) => i.id, { maxEntries: 3, startingToken: page.nextToken });
  assert.deepEqual(rest, { entries: [items[3]], nextToken: "" });
});
