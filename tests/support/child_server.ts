/**
 * A real server a test runs as a child process on a free 127.0.0.1 port (versitygw,
 * Prometheus): started, waited for, retried on a lost port race, stopped. One place for the
 * start/wait/stop that each server's helper would otherwise write again.
 */

import { freePort, tail } from "./go_tool.ts";

/** How to start one kind of server and how to tell it is ready. */
export interface ChildServerSpec {
  /** Its name in error messages, e.g. "versitygw". */
  readonly name: string;
  readonly bin: string;
  /** Its temporary directory: removed on stop, and when it cannot be started at all. */
  readonly dir: string;
  /** Its arguments to listen on 127.0.0.1:`port`. */
  readonly args: (port: number) => string[];
  readonly cwd?: string;
  /** One readiness probe of `url`: true once ready; false or a throw while not yet. */
  readonly probe: (url: URL) => Promise<boolean>;
  /** The error's words for "not ready", e.g. "did not answer on". */
  readonly notReady: string;
  readonly startMs: number;
  /** The pause between probes. */
  readonly pollMs: number;
  /** More to do once ready (e.g. create a bucket); its failure is a failed start. */
  readonly afterReady?: (url: URL) => Promise<void>;
}

/** A running child server; `stop` ends it and removes its directory. */
export class ChildServer implements AsyncDisposable {
  /** e.g. http://127.0.0.1:40123 */
  readonly url: URL;
  readonly dir: string;
  readonly #child: Deno.ChildProcess;
  readonly #output: { text: string };
  readonly #drained: Promise<unknown>;

  private constructor(url: URL, dir: string, child: Deno.ChildProcess) {
    this.url = url;
    this.dir = dir;
    this.#child = child;
    this.#output = { text: "" };
    this.#drained = Promise.all([
      tail(child.stdout, this.#output),
      tail(child.stderr, this.#output),
    ]);
  }

  /**
   * Starts the server on a free port and waits until it is ready; up to 3 tries, since another
   * process may take the port between our check and the server's bind.
   * @throws {Error} with the server's last output when the third try fails
   */
  static async start(spec: ChildServerSpec): Promise<ChildServer> {
    for (let attempt = 1;; attempt++) {
      const port = freePort();
      const child = new Deno.Command(spec.bin, {
        args: spec.args(port),
        ...(spec.cwd === undefined ? {} : { cwd: spec.cwd }),
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const server = new ChildServer(new URL(`http://127.0.0.1:${port}`), spec.dir, child);
      try {
        await server.#waitUntilReady(spec);
        await spec.afterReady?.(server.url);
        return server;
      } catch (e) {
        await server.#kill();
        if (attempt >= 3) {
          await Deno.remove(spec.dir, { recursive: true }).catch(() => {});
          throw e;
        }
      }
    }
  }

  async #waitUntilReady(spec: ChildServerSpec): Promise<void> {
    let exited = false;
    this.#child.status.then(() => exited = true);
    const deadline = Date.now() + spec.startMs;
    while (Date.now() < deadline && !exited) {
      try {
        if (await spec.probe(this.url)) return;
      } catch {
        // Not listening yet.
      }
      await new Promise((r) => setTimeout(r, spec.pollMs));
    }
    throw new Error(
      `${spec.name} ${spec.notReady} ${this.url} (${exited ? "it exited" : "timed out"}):\n` +
        this.#output.text,
    );
  }

  /** What the server printed last (its log and errors). */
  get output(): string {
    return this.#output.text;
  }

  async #kill(): Promise<void> {
    try {
      this.#child.kill("SIGTERM");
    } catch {
      // Already gone.
    }
    await this.#child.status;
    await this.#drained;
  }

  /** Stops the server and removes its directory. */
  async stop(): Promise<void> {
    await this.#kill();
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/**
 * The base of a server helper's class (S3Server, PrometheusServer): its output, stop and
 * disposal are those of the child it holds.
 */
export class ChildServerHolder implements AsyncDisposable {
  readonly #server: ChildServer;

  protected constructor(server: ChildServer) {
    this.#server = server;
  }

  /** What the server printed last (its log and errors). */
  get output(): string {
    return this.#server.output;
  }

  /** Stops the server and removes its directory. */
  async stop(): Promise<void> {
    await this.#server.stop();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}
