/**
 * A deleted zvol gives its reservation back (docs/deleting.md). When DeleteVolume sets a zvol
 * aside, its refreservation is recorded in {@linkcode RESERVATION_RECORD_PROPERTY}, in the same
 * `zfs set` as the deletion marks, and only then set to none; `zfs-csi undelete` puts it back
 * before the zvol leaves the trash, and where the pool no longer has the room it refuses and
 * changes nothing. A sparse zvol reserves nothing: it gets no record and nothing is dropped.
 *
 * The steps, and what an interruption between two of them leaves:
 * - set aside: rename, record (with the marks), drop. Renamed but not marked: an unmarked
 *   `.deleted-*` zvol, kept with its reservation, which the purge never destroys (as for every
 *   volume). Marked and recorded but not dropped: a set-aside zvol that still holds its space
 *   until the purge, as before this step existed; undelete puts back what is there already.
 *   Dropped is never without its record.
 * - undelete: put back, rename, remove the marks and the record. Put back but not renamed: a
 *   set-aside zvol holding its reservation again (the next undelete finishes; the purge destroys
 *   it as any other).
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import { parseBytes, type PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** User property holding a set-aside zvol's refreservation (bytes) from before it was dropped. */
export const RESERVATION_RECORD_PROPERTY = "org.zfs-csi:deleted-refreservation";

/** What undelete reads of a set-aside zvol to put its reservation back. */
export const RESERVATION_PROPERTIES = [
  "volsize",
  "refreservation",
  RESERVATION_RECORD_PROPERTY,
] as const;

/**
 * The record of a zvol whose refreservation is `refreservation` (`zfs get -p`: bytes, `0` or
 * `none`): its bytes, or undefined when it reserves nothing (sparse).
 * @throws {SyntaxError} when the value is not a byte count
 */
export function reservationRecord(refreservation: string | undefined): string | undefined {
  const bytes = parseBytes(refreservation ?? "0");
  return bytes > 0 ? String(bytes) : undefined;
}

/** How a set-aside zvol's reservation goes back. */
export type ReservationPlan =
  /** Nothing recorded: sparse, or set aside by a plugin that kept the reservation. */
  | { readonly kind: "none" }
  /**
   * It reserved at least its whole volsize, the full reservation a zvol is made with:
   * `refreservation=auto`, what OpenZFS reserves for a zvol of its size now, never less than
   * the record.
   */
  | { readonly kind: "auto"; readonly bytes: number }
  /** A reservation of part of it (set by hand): exactly the record. */
  | { readonly kind: "value"; readonly bytes: number };

/**
 * What to put back on the set-aside zvol `hidden`, from its {@linkcode RESERVATION_PROPERTIES}.
 * @throws {CsiError} FAILED_PRECONDITION when the record is not a byte count
 */
export function reservationPlan(hidden: string, props: PropertyMap): ReservationPlan {
  const record = props.get(RESERVATION_RECORD_PROPERTY);
  if (!record || record.source !== "local" || record.value === "-") return { kind: "none" };
  if (!/^[1-9]\d{0,19}$/.test(record.value) || !Number.isSafeInteger(Number(record.value))) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${hidden}" records its reservation as "${record.value}", not a positive byte count; ` +
        `nothing was changed: set ${RESERVATION_RECORD_PROPERTY} to its refreservation in bytes first`,
    );
  }
  const bytes = Number(record.value);
  const volsize = parseBytes(props.get("volsize")?.value ?? "0");
  return bytes >= volsize && volsize > 0 ? { kind: "auto", bytes } : { kind: "value", bytes };
}

/**
 * Puts the recorded reservation back on the set-aside zvol `hidden` (before it is renamed to
 * `dest`), as `plan` says.
 * @throws {CsiError} RESOURCE_EXHAUSTED when the pool has no room for it; the zvol is then as
 *   it was (reserving nothing)
 * @throws {ZfsError} for other failures
 */
export async function restoreReservation(
  zfs: Zfs,
  hidden: string,
  dest: string,
  plan: ReservationPlan,
): Promise<void> {
  if (plan.kind === "none") return;
  const noRoom = (err: ZfsError) =>
    new CsiError(
      Code.RESOURCE_EXHAUSTED,
      `The pool has no room to reserve ${plan.bytes} bytes for "${dest}" again ` +
        `(zfs said: ${err.stderr.trim()}); it stays set aside as "${hidden}", unchanged: make ` +
        `room in the pool and try again`,
      { cause: err },
    );
  const put = async (value: string) => {
    try {
      await zfs.set(hidden, "refreservation", value);
    } catch (err) {
      if (err instanceof ZfsError && err.kind === "no_space") throw noRoom(err);
      throw err;
    }
  };
  if (plan.kind === "value") return await put(String(plan.bytes));
  await put("auto");
  // A reservation set by hand above the full one stays as large as it was.
  const now = await zfs.getProperties(hidden, ["refreservation"]);
  if (parseBytes(now?.get("refreservation")?.value ?? "0") >= plan.bytes) return;
  try {
    await put(String(plan.bytes));
  } catch (err) {
    // Leave it as it was found: a lower reservation always fits.
    if (err instanceof CsiError) await zfs.set(hidden, "refreservation", "none");
    throw err;
  }
}
