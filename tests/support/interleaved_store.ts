/**
 * One store shared by several actors (two nodes, say) whose requests run one at a time in an
 * order the test chooses, for interleaving tests of protocols that rely on a linearizable store
 * (S3 is strongly consistent; so is the directory store). Each actor gets its own
 * {@linkcode Store} view; every request of a view waits until the schedule gives that actor
 * the turn, runs alone, and then the next turn is given. An actor that makes no more requests
 * (it finished, or waits on something else) is skipped once it says so with
 * {@linkcode Interleaver.done}; once the schedule is used up, requests run as they come.
 */

import type {
  ObjectBytes,
  PutResult,
  Store,
  StoredObject,
  TransferOptions,
  WriteCondition,
} from "../../src/store/store.ts";

/** Runs the store's requests of several actors one at a time, in the order of a schedule. */
export class Interleaver {
  readonly #store: Store;
  readonly #schedule: readonly string[];
  #at = 0;
  #busy = false;
  readonly #done = new Set<string>();
  /** Actors waiting for their turn, in the order they came. */
  readonly #waiting: { actor: string; go: () => void }[] = [];
  /** Every request in the order it ran: "<actor> <method> <key>". */
  readonly trace: string[] = [];

  /**
   * @param schedule the actor of each request, in order (an actor that has finished is
   *   skipped); after the last, requests run in the order they come
   */
  constructor(store: Store, schedule: readonly string[]) {
    this.#store = store;
    this.#schedule = schedule;
  }

  /** The store as `actor` sees it. */
  view(actor: string): Store {
    const store = this.#store;
    const run = <T>(what: string, op: () => Promise<T>) => this.#run(actor, what, op);
    return {
      description: store.description,
      putStream: (key: string, body: ReadableStream<Uint8Array>, options?: TransferOptions) =>
        run<PutResult>(`putStream ${key}`, () => store.putStream(key, body, options)),
      putBytes: (key: string, bytes: Uint8Array, condition?: WriteCondition) =>
        run<PutResult>(`putBytes ${key}`, () => store.putBytes(key, bytes, condition)),
      getStream: (key: string, options?: TransferOptions) =>
        run<ReadableStream<Uint8Array>>(`getStream ${key}`, () => store.getStream(key, options)),
      getBytes: (key: string) =>
        run<ObjectBytes | undefined>(`getBytes ${key}`, () => store.getBytes(key)),
      list: (prefix: string) => run<StoredObject[]>(`list ${prefix}`, () => store.list(prefix)),
      delete: (key: string) => run<void>(`delete ${key}`, () => store.delete(key)),
    };
  }

  /** `actor` makes no more requests: its turns are skipped from now on. */
  done(actor: string): void {
    this.#done.add(actor);
    this.#next();
  }

  async #run<T>(actor: string, what: string, op: () => Promise<T>): Promise<T> {
    await new Promise<void>((go) => {
      this.#waiting.push({ actor, go });
      this.#next();
    });
    try {
      this.trace.push(`${actor} ${what}`);
      return await op();
    } finally {
      this.#busy = false;
      this.#next();
    }
  }

  /** Gives the turn to the actor the schedule names, if it is waiting (or to anyone after). */
  #next(): void {
    if (this.#busy) return;
    while (this.#at < this.#schedule.length && this.#done.has(this.#schedule[this.#at]!)) {
      this.#at++;
    }
    const want = this.#at < this.#schedule.length ? this.#schedule[this.#at] : undefined;
    const i = want === undefined ? 0 : this.#waiting.findIndex((w) => w.actor === want);
    const next = this.#waiting[i];
    if (i < 0 || next === undefined) return;
    this.#waiting.splice(i, 1);
    if (want !== undefined) this.#at++;
    this.#busy = true;
    next.go();
  }
}

/**
 * The schedules of two actors with at most two switches: `first` makes `a` requests, `second`
 * makes `b`, then `first` all the rest, then `second`; for every `a` up to `firstRequests` and
 * `b` up to `secondRequests`, and both ways round. Every race of one request of each side
 * against a window of the other is among them.
 */
export function twoSwitchSchedules(
  x: { readonly actor: string; readonly requests: number },
  y: { readonly actor: string; readonly requests: number },
): string[][] {
  const out: string[][] = [];
  const rest = 1000;
  for (const [first, second] of [[x, y], [y, x]] as const) {
    for (let a = 0; a <= first.requests; a++) {
      for (let b = 0; b <= second.requests; b++) {
        out.push([
          ...Array<string>(a).fill(first.actor),
          ...Array<string>(b).fill(second.actor),
          ...Array<string>(rest).fill(first.actor),
          ...Array<string>(rest).fill(second.actor),
        ]);
      }
    }
  }
  return out;
}
