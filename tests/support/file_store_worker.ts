/**
 * One of several processes racing on one directory store, for
 * tests/integration/file_store_processes_test.ts. Arguments: the store's directory, this
 * worker's id, the number of keys to race for. It writes `<root>/../ready-<id>`, waits for
 * `<root>/../go`, then (1) tries to create each key `race/<n>.json` with ifNoneMatch and
 * (2) increments the counter in `counter.json` ten times by ifMatch read-modify-write. It prints
 * `{"won":[...key numbers...],"retries":n}` on stdout.
 */

import { FileStore } from "../../src/store/file_store.ts";
import { StoreError } from "../../src/store/store.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const [root = "", id = "", keyCount = "0"] = Deno.args;
const store = new FileStore(root);
const outer = root.slice(0, root.lastIndexOf("/"));

await Deno.writeTextFile(`${outer}/ready-${id}`, "");
for (;;) {
  try {
    await Deno.lstat(`${outer}/go`);
    break;
  } catch {
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}

const won: number[] = [];
for (let n = 0; n < Number(keyCount); n++) {
  try {
    await store.putBytes(`race/${n}.json`, encoder.encode(id), { ifNoneMatch: "*" });
    won.push(n);
  } catch (err) {
    if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
  }
}

let retries = 0;
for (let i = 0; i < 10; i++) {
  for (;;) {
    const current = await store.getBytes("counter.json");
    if (current === undefined) throw new Error("counter.json is missing");
    const next = String(Number(decoder.decode(current.bytes)) + 1);
    try {
      await store.putBytes("counter.json", encoder.encode(next), { ifMatch: current.etag });
      break;
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      retries++;
    }
  }
}

await Deno.stdout.write(encoder.encode(`${JSON.stringify({ won, retries })}\n`));
