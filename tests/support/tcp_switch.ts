/**
 * A TCP forwarder on a fixed port of 127.0.0.1 in front of a server, that a test switches off and
 * on: off closes the listener and every open connection (clients are refused, as by a server
 * that is down), on listens on the same port again. For a store that goes away and comes back
 * while the plugin keeps its endpoint.
 */

/** The forwarder; `down()` and `up()` switch it. */
export class TcpSwitch implements AsyncDisposable {
  /** http://127.0.0.1:<port>, for clients. */
  readonly endpoint: URL;
  readonly #target: { readonly hostname: string; readonly port: number };
  readonly #port: number;
  #listener: Deno.TcpListener | undefined;
  #accepting: Promise<void> | undefined;
  readonly #conns = new Set<Deno.Conn>();

  private constructor(target: URL, listener: Deno.TcpListener) {
    this.#target = { hostname: target.hostname, port: Number(target.port) };
    this.#port = listener.addr.port;
    this.endpoint = new URL(`http://127.0.0.1:${this.#port}`);
    this.#serve(listener);
  }

  /** Listens on a free port and forwards to `target` (http://host:port). */
  static start(target: URL): TcpSwitch {
    return new TcpSwitch(target, Deno.listen({ hostname: "127.0.0.1", port: 0 }));
  }

  /** Whether it forwards now. */
  get isUp(): boolean {
    return this.#listener !== undefined;
  }

  /** Listens again on the same port. */
  up(): void {
    if (this.#listener) return;
    this.#serve(Deno.listen({ hostname: "127.0.0.1", port: this.#port }));
  }

  /** Stops listening and cuts every connection. */
  async down(): Promise<void> {
    const listener = this.#listener;
    this.#listener = undefined;
    if (!listener) return;
    listener.close();
    await this.#accepting;
    for (const c of this.#conns) closeQuietly(c);
    this.#conns.clear();
  }

  #serve(listener: Deno.TcpListener): void {
    this.#listener = listener;
    this.#accepting = (async () => {
      try {
        for await (const conn of listener) void this.#forward(conn);
      } catch {
        // Closed by down().
      }
    })();
  }

  async #forward(conn: Deno.Conn): Promise<void> {
    this.#conns.add(conn);
    let upstream: Deno.Conn;
    try {
      upstream = await Deno.connect(this.#target);
    } catch {
      this.#conns.delete(conn);
      closeQuietly(conn);
      return;
    }
    this.#conns.add(upstream);
    const pipe = (from: Deno.Conn, to: Deno.Conn) =>
      from.readable.pipeTo(to.writable, { preventClose: true }).catch(() => {});
    // Either side ending ends both (HTTP needs no half-closed connections).
    await Promise.race([pipe(conn, upstream), pipe(upstream, conn)]);
    for (const c of [conn, upstream]) {
      this.#conns.delete(c);
      closeQuietly(c);
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.down();
  }
}

function closeQuietly(c: Deno.Conn): void {
  try {
    c.close();
  } catch {
    // Already closed.
  }
}
