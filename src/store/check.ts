/**
 * Checks a store does what the plugin relies on, with a probe object of its own under
 * `v1/probe/`: that it answers, that the bucket exists, that it lists, writes, reads and
 * deletes, and above all that it enforces conditional writes. A server that takes
 * `If-None-Match: *` or `If-Match` and writes all the same lets two nodes acquire one volume that
 * follows its job (src/follow/owner.ts): the plugin refuses such volumes on it (ordinary backups
 * do not depend on it). Run by `zfs-csi store check` and, for an S3 store, in the background at
 * start-up (src/store/conditional.ts).
 */

import { LAYOUT_PREFIX } from "./layout.ts";
import { type Store, StoreError } from "./store.ts";

/** The prefix of probe objects: never a volume's key. */
export const PROBE_PREFIX = `${LAYOUT_PREFIX}/probe/`;

/** One thing checked: passed, failed, or not tried (an earlier step failed). */
export interface CheckStep {
  readonly name: string;
  readonly status: "ok" | "failed" | "skipped";
  /** What was seen: the answer, or why it was not tried. */
  readonly detail: string;
}

/** What the store's conditional writes are worth. */
export type ConditionalVerdict =
  /** The store refused both losing conditions and took the winning ones. */
  | { readonly kind: "enforced" }
  /** It took a write whose condition did not hold, or refused one that did: `detail` says which. */
  | { readonly kind: "not_enforced"; readonly detail: string }
  /** The check could not get that far (the store failed): try again later. */
  | { readonly kind: "unknown"; readonly error: unknown };

/** A whole check. */
export interface CheckReport {
  readonly store: string;
  readonly steps: readonly CheckStep[];
  readonly conditional: ConditionalVerdict;
  /** Whether every step passed. */
  readonly ok: boolean;
}

/** Options of {@linkcode checkStore}. */
export interface CheckOptions {
  /** This node's id: in the probe key, so that two nodes checking at once never meet. */
  readonly node: string;
  /** Whether "bucket exists" is a step (an S3 store). */
  readonly bucket?: boolean;
  /** Random hex for the probe key; replaceable in tests. */
  readonly random?: () => string;
  /** Steps as they finish (the command prints them as they come). */
  readonly onStep?: (step: CheckStep) => void;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** An etag no object has: S3's are 32 hex digits (and more for multipart), never all zero. */
const NO_SUCH_ETAG = "00000000000000000000000000000000";
/** Kinds of a conditional write's failure that mean the server does not do them as S3 does. */
const REFUSED = new Set(["invalid", "precondition_failed", "misconfigured"]);

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function randomHex(): string {
  return [...crypto.getRandomValues(new Uint8Array(8))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** What a write under a condition that must not hold did: refused (as it must), or not. */
async function losingWrite(
  store: Store,
  key: string,
  bytes: Uint8Array,
  condition: Parameters<Store["putBytes"]>[2] & object,
  described: string,
): Promise<string | undefined> {
  try {
    await store.putBytes(key, bytes, condition);
  } catch (err) {
    if (err instanceof StoreError && err.kind === "precondition_failed") return undefined;
    throw err;
  }
  return `a write with ${described} was accepted (the server answered success and wrote it) ` +
    `where S3 answers 412 Precondition Failed`;
}

/**
 * Checks `store` (see the module doc). Never throws for what the store does: each failure is a
 * step, and the verdict on conditional writes is "unknown" when the check could not get there.
 */
export async function checkStore(store: Store, options: CheckOptions): Promise<CheckReport> {
  const steps: CheckStep[] = [];
  const step = (name: string, status: CheckStep["status"], detail: string) => {
    const s = { name, status, detail };
    steps.push(s);
    options.onStep?.(s);
  };
  const skipRest = (names: readonly string[], why: string) => {
    for (const name of names) step(name, "skipped", why);
  };
  const later = ["put, get and delete", "conditional writes"];
  const done = (conditional: ConditionalVerdict): CheckReport => ({
    store: store.description,
    steps,
    conditional,
    ok: steps.every((s) => s.status === "ok"),
  });

  // Reachable, the bucket, listing: one listing of the probe prefix tells all three apart.
  try {
    await store.list(PROBE_PREFIX);
    step("reachable", "ok", "it answered");
    if (options.bucket) step("bucket exists", "ok", "listing it worked");
    step("listing", "ok", `listed "${PROBE_PREFIX}"`);
  } catch (err) {
    const kind = err instanceof StoreError ? err.kind : "unavailable";
    if (kind === "unavailable") {
      step("reachable", "failed", message(err));
      skipRest([...options.bucket ? ["bucket exists"] : [], "listing", ...later], "unreachable");
    } else if (kind === "misconfigured") {
      step("reachable", "ok", "it answered");
      step(options.bucket ? "bucket exists" : "listing", "failed", message(err));
      skipRest([...options.bucket ? ["listing"] : [], ...later], "the store is not set up");
    } else {
      step("reachable", "ok", "it answered");
      if (options.bucket) step("bucket exists", "skipped", "not known: the listing was refused");
      step("listing", "failed", message(err));
      skipRest(later, "the listing failed");
    }
    return done({ kind: "unknown", error: err });
  }

  const key = `${PROBE_PREFIX}${options.node}-${(options.random ?? randomHex)()}`;
  const first = encoder.encode(`zfs-csi store check by ${options.node}: first\n`);
  let etag: string;
  try {
    await store.putBytes(key, first);
    const got = await store.getBytes(key);
    if (got === undefined || decoder.decode(got.bytes) !== decoder.decode(first)) {
      throw new StoreError("invalid", `"${key}" read back ${got ? "other bytes" : "as missing"}`);
    }
    etag = got.etag;
    await store.delete(key);
    if (await store.getBytes(key) !== undefined) {
      throw new StoreError("invalid", `"${key}" is still there after its delete`);
    }
    step("put, get and delete", "ok", `wrote, read back and deleted "${key}"`);
  } catch (err) {
    step("put, get and delete", "failed", message(err));
    skipRest(["conditional writes"], "put, get or delete failed");
    await store.delete(key).catch(() => {});
    return done({ kind: "unknown", error: err });
  }

  let verdict: ConditionalVerdict;
  try {
    // Create-if-absent on a key that is absent: must be taken (a new owner object).
    await store.putBytes(key, first, { ifNoneMatch: "*" });
    const now = (await store.getBytes(key))?.etag ?? etag;
    const second = encoder.encode(`zfs-csi store check by ${options.node}: second\n`);
    const lost = await losingWrite(
      store,
      key,
      second,
      { ifNoneMatch: "*" },
      `If-None-Match: * to an object that exists`,
    ) ??
      await losingWrite(
        store,
        key,
        second,
        { ifMatch: NO_SUCH_ETAG },
        `If-Match: "${NO_SUCH_ETAG}" (an etag the object does not have)`,
      );
    if (lost !== undefined) {
      verdict = { kind: "not_enforced", detail: lost };
    } else {
      // A write under the object's own etag: must be taken (a lease renewed).
      await store.putBytes(key, second, { ifMatch: now });
      verdict = { kind: "enforced" };
    }
  } catch (err) {
    // Refused by the server (501 NotImplemented, 412 on the object's own etag): not enforced as
    // S3 does. The store failing (unreachable, full, denied): not known.
    verdict = err instanceof StoreError && REFUSED.has(err.kind)
      ? { kind: "not_enforced", detail: `a conditional write failed: ${message(err)}` }
      : { kind: "unknown", error: err };
  } finally {
    await store.delete(key).catch(() => {});
  }
  if (verdict.kind === "enforced") {
    step(
      "conditional writes",
      "ok",
      "If-None-Match: * and If-Match are enforced (412 when they do not hold)",
    );
  } else {
    step(
      "conditional writes",
      "failed",
      verdict.kind === "not_enforced" ? verdict.detail : message(verdict.error),
    );
  }
  return done(verdict);
}

/** The probe's conditional-write steps only, as the plugin runs them at start-up. */
export async function checkConditionalWrites(
  store: Store,
  options: Omit<CheckOptions, "onStep" | "bucket">,
): Promise<ConditionalVerdict> {
  return (await checkStore(store, options)).conditional;
}
