/**
 * Reads a command's piped output to its end. The plugin's runner (src/run.ts) uses this instead
 * of `ChildProcess.output()`: on Deno 2.8 and 2.9 that method collects each piped stream into a
 * native buffer (about 50 KiB even for no output) which is freed only when a full GC collects it,
 * and the plugin's small heap seldom needs one, so RSS climbed by about 100 KiB per command
 * started, to 350 MiB and more (bench/rss_isolate.ts shows it). Chunks read here are ordinary
 * small buffers that die young.
 */

/** Every byte of `stream`, in order, as one array. */
export async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let length = 0;
  const reader = stream.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      chunks.push(value);
      length += value.length;
    }
  } finally {
    reader.releaseLock();
  }
  if (chunks.length === 1) return chunks[0]!;
  const all = new Uint8Array(length);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return all;
}

/** What `ChildProcess.output()` gives, read without it: exit code, stdout and stderr. */
export interface ChildOutput {
  readonly code: number;
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;
}

/** Waits for `child` (stdout and stderr piped) to end, reading both streams to their end. */
export async function childOutput(child: Deno.ChildProcess): Promise<ChildOutput> {
  const [stdout, stderr, status] = await Promise.all([
    readAll(child.stdout),
    readAll(child.stderr),
    child.status,
  ]);
  return { code: status.code, stdout, stderr };
}
