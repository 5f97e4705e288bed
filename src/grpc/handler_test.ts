import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { Code, CsiError, ZfsError } from "../errors.ts";
import { KeyedLock, withLock } from "../lock.ts";
import { Logger } from "../log.ts";
import { volumeCalls } from "../foreground.ts";
import { unary } from "./handler.ts";

type Handler = ReturnType<typeof unary>;
type Call = Parameters<Handler>[0];
type Callback = Parameters<Handler>[1];

interface Outcome {
  readonly error: { code?: number; details?: string } | null;
  readonly response: unknown;
}

/** Calls `handler` as grpc-js would; `events` stands in for the call's event emitter. */
function invoke(
  handler: Handler,
  request: Record<string, unknown>,
  events?: EventEmitter,
): Promise<Outcome> {
  return new Promise((resolve) => {
    const call = (events ? Object.assign(events, { request }) : { request }) as unknown as Call;
    const callback = ((error: Outcome["error"], response: unknown) =>
      resolve({ error, response })) as unknown as Callback;
    handler(call, callback);
  });
}

function logger(): { log: Logger; records: () => Record<string, unknown>[]; text: () => string } {
  const lines: string[] = [];
  return {
    log: new Logger("debug", {}, (l) => lines.push(l)),
    records: () => lines.map((l) => JSON.parse(l)),
    text: () => lines.join("\n"),
  };
}

Deno.test("unary answers with the handler's response and logs one info line", async () => {
  const { log, records } = logger();
  const handler = unary("NodeStageVolume", () => Promise.resolve({ ok: 1 }), log);
  const outcome = await invoke(handler, {
    volume_id: "v1",
    staging_target_path: "/local/csi/staging/v1/rw",
    secrets: { password: "hunter2" },
  });
  assert.deepEqual(outcome, { error: null, response: { ok: 1 } });
  const [line, ...rest] = records();
  assert.equal(rest.length, 0);
  assert.equal(line!.level, "info");
  assert.equal(line!.msg, "rpc");
  assert.equal(line!.method, "NodeStageVolume");
  assert.equal(line!.volumeId, "v1");
  assert.equal(line!.stagingTargetPath, "/local/csi/staging/v1/rw");
  assert.equal(line!.code, "OK");
  assert.equal(typeof line!.durationMs, "number");
  assert.equal("secrets" in line!, false);
});

Deno.test("unary logs chatty calls such as Probe at debug", async () => {
  const { log, records } = logger();
  await invoke(unary("Probe", () => Promise.resolve({}), log), {});
  assert.deepEqual(records().map((r) => [r.level, r.method, r.code]), [["debug", "Probe", "OK"]]);
});

Deno.test("unary sends a CsiError's code and message and logs a warning", async () => {
  const { log, records } = logger();
  const handler = unary(
    "NodePublishVolume",
    () => Promise.reject(new CsiError(Code.FAILED_PRECONDITION, 'Volume "v1" is not staged')),
    log,
  );
  const outcome = await invoke(handler, { volume_id: "v1" });
  assert.deepEqual(outcome, {
    error: { code: Code.FAILED_PRECONDITION, details: 'Volume "v1" is not staged' },
    response: null,
  });
  const [line] = records();
  assert.equal(line!.level, "warn");
  assert.equal(line!.code, "FAILED_PRECONDITION");
  assert.equal(line!.error, 'Volume "v1" is not staged');
});

Deno.test("unary maps a ZfsError by kind and logs its argv", async () => {
  const { log, records } = logger();
  const err = new ZfsError(
    "busy",
    ["zfs", "destroy", "t/v"],
    "cannot destroy 't/v': dataset is busy\n",
  );
  const outcome = await invoke(unary("DeleteVolume", () => Promise.reject(err), log), {});
  assert.equal(outcome.error?.code, Code.FAILED_PRECONDITION);
  assert.equal(
    outcome.error?.details,
    `ZFS operation "zfs destroy" failed (busy): cannot destroy 't/v': dataset is busy`,
  );
  assert.deepEqual(records()[0]!.argv, ["zfs", "destroy", "t/v"]);
});

Deno.test("unary answers INTERNAL with a generic message and logs the cause for other errors", async () => {
  const { log, records, text } = logger();
  const outcome = await invoke(
    unary(
      "NodeStageVolume",
      () => Promise.reject(new TypeError("x is undefined at /src/secret.ts")),
      log,
    ),
    { volume_id: "v1" },
  );
  assert.deepEqual(outcome, {
    error: { code: Code.INTERNAL, details: "Internal error, see the plugin logs" },
    response: null,
  });
  const [line] = records();
  assert.equal(line!.level, "error");
  assert.equal(line!.code, "INTERNAL");
  assert.match(text(), /x is undefined at \/src\/secret\.ts/);
});

Deno.test("unary turns a handler that throws synchronously into an error status", async () => {
  const { log } = logger();
  const outcome = await invoke(
    unary("NodeGetInfo", () => {
      throw new CsiError(Code.INVALID_ARGUMENT, "bad");
    }, log),
    {},
  );
  assert.deepEqual(outcome.error, { code: Code.INVALID_ARGUMENT, details: "bad" });
});

Deno.test("unary names the call to those that wait for its volume, and logs how long a call waited", async () => {
  const { log, records } = logger();
  const locks = new KeyedLock();
  const { promise: release, resolve: open } = Promise.withResolvers<void>();
  const holder = invoke(
    unary("NodeUnpublishVolume", () => withLock(locks, ["tank/nomad/v1"], () => release), log),
    { volume_id: "v1@n1", target_path: "/t" },
  );
  const refused = await invoke(
    unary(
      "NodePublishVolume",
      () => withLock(locks, ["tank/nomad/v1"], () => Promise.resolve({}), { timeoutMs: 20 }),
      log,
    ),
    { volume_id: "v1@n1" },
  );
  assert.equal(refused.error?.code, Code.UNAVAILABLE);
  assert.match(refused.error?.details ?? "", /is held by NodeUnpublishVolume "v1@n1"/);
  const waiter = invoke(
    unary(
      "NodeStageVolume",
      () => withLock(locks, ["tank/nomad/v1"], () => Promise.resolve({})),
      log,
    ),
    { volume_id: "v1@n1" },
  );
  await new Promise((r) => setTimeout(r, 15));
  open();
  assert.deepEqual(await holder, { error: null, response: undefined });
  assert.deepEqual(await waiter, { error: null, response: {} });
  const lines = records();
  const of = (method: string) => lines.find((l) => l.method === method)!;
  assert.equal(of("NodePublishVolume").code, "UNAVAILABLE");
  assert.ok((of("NodePublishVolume").lockWaitMs as number) >= 15, "the refused call waited");
  assert.ok((of("NodeStageVolume").lockWaitMs as number) >= 10, "the later call waited its turn");
  assert.equal("lockWaitMs" in of("NodeUnpublishVolume"), false, "the first call did not wait");
});

Deno.test("unary stops a call's wait for a lock when the client cancels it", async () => {
  const { log, records } = logger();
  const locks = new KeyedLock();
  const held = locks.tryAcquire(["tank/nomad/v1"])!;
  const events = new EventEmitter();
  let ran = false;
  const outcome = invoke(
    unary("NodeStageVolume", () =>
      withLock(locks, ["tank/nomad/v1"], () => {
        ran = true;
        return Promise.resolve({});
      }), log),
    { volume_id: "v1@n1" },
    events,
  );
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(locks.waiting("tank/nomad/v1"), 1);
  events.emit("cancelled");
  assert.deepEqual((await outcome).error, {
    code: Code.CANCELLED,
    details: 'Call cancelled while waiting for "tank/nomad/v1"',
  });
  assert.equal(locks.waiting("tank/nomad/v1"), 0);
  assert.equal(ran, false);
  assert.equal(records()[0]!.code, "CANCELLED");
  held.release();
});

Deno.test("unary tells its observer each call's method, status name and seconds", async () => {
  const { log } = logger();
  const seen: [string, string, number][] = [];
  const observe = (m: string, c: string, s: number) => void seen.push([m, c, s]);
  await invoke(unary("Probe", () => Promise.resolve({}), log, observe), {});
  await invoke(
    unary("DeleteVolume", () => Promise.reject(new CsiError(Code.NOT_FOUND, "gone")), log, observe),
    { volume_id: "v" },
  );
  assert.deepEqual(seen.map(([m, c]) => [m, c]), [["Probe", "OK"], ["DeleteVolume", "NOT_FOUND"]]);
  assert.ok(seen.every(([, , s]) => s >= 0 && s < 10));
});

Deno.test("unary counts volume calls as in flight while their handler runs, answered or failed", async () => {
  const { log } = logger();
  const seen: Record<string, boolean> = {};
  const watch = (method: string, fails: boolean) =>
    unary(method, () => {
      seen[method] = volumeCalls.busyBesides(undefined);
      return fails ? Promise.reject(new CsiError(Code.INTERNAL, "no")) : Promise.resolve({});
    }, log);
  assert.equal(volumeCalls.busyBesides(undefined), false);
  await invoke(watch("NodeStageVolume", false), { volume_id: "v1" });
  assert.equal(volumeCalls.busyBesides(undefined), false, "still counted after the answer");
  await invoke(watch("NodePublishVolume", true), { volume_id: "v1" });
  assert.equal(volumeCalls.busyBesides(undefined), false, "still counted after the error");
  await invoke(watch("Probe", false), {});
  await invoke(watch("CreateSnapshot", false), { name: "s" });
  assert.deepEqual(seen, {
    NodeStageVolume: true,
    NodePublishVolume: true,
    // Not volume calls: a CreateSnapshot waits for its own upload's hash.
    Probe: false,
    CreateSnapshot: false,
  });
});
