import assert from "node:assert/strict";
import { ConfigError } from "../config.ts";
import { run } from "./demo.ts";
import { memoryIo } from "./test_io.ts";

Deno.test("demo refuses, before dialling, a socket or base dir this build may not read and write", async () => {
  // Unit tests may write /tmp only.
  await assert.rejects(
    () =>
      run(
        ["--endpoint", "unix:///run/elsewhere/csi.sock", "--stage-publish-base-dir", "/tmp/b"],
        memoryIo(),
      ),
    (e) =>
      e instanceof ConfigError &&
      /may not read and write "\/run\/elsewhere\/csi.sock"; rebuild with ZFS_CSI_EXTRA_DIRS=\/run\/elsewhere/
        .test(e.message),
  );
  await assert.rejects(
    () =>
      run(
        ["--endpoint", "unix:///tmp/s.sock", "--stage-publish-base-dir", "/local/csi"],
        memoryIo(),
      ),
    /may not read and write "\/local\/csi"/,
  );
});

Deno.test("demo refuses a bad endpoint, size or flag in one ConfigError", async () => {
  for (
    const [args, re] of [
      [["--endpoint", "tcp://127.0.0.1:1"], /not unix:\/\/\/absolute\/path/],
      [["--endpoint", "unix:///tmp/s.sock", "--size", "1.5"], /--size "1.5"/],
      [["--nope"], /nope/],
    ] as const
  ) {
    await assert.rejects(
      () => run([...args], memoryIo()),
      (e) => e instanceof ConfigError && re.test(e.message),
    );
  }
});

Deno.test("demo against no running plugin names the socket and says so, without gRPC's text", async () => {
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-demo-" });
  try {
    const err = await run(
      ["--endpoint", `unix://${dir}/csi.sock`, "--stage-publish-base-dir", `${dir}/base`],
      memoryIo(),
    ).then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof Error);
    assert.equal(
      err.message,
      `cannot reach the plugin at ${dir}/csi.sock: there is no socket there: the plugin is not ` +
        `running; start it (deno task dev), or give --endpoint as the plugin has it`,
    );
    assert.ok(!/UNAVAILABLE|No connection established|Resolution note|ENOENT/.test(err.message));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
