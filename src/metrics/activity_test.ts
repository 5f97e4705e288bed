import assert from "node:assert/strict";
import { Activity, commandLabels } from "./activity.ts";
import { render } from "./exposition.ts";

Deno.test("commandLabels names the program and subcommand, never a dataset or path", () => {
  assert.deepEqual(commandLabels(["zfs", "get", "-Hp", "used", "tank/v"]), ["zfs", "get"]);
  assert.deepEqual(commandLabels(["/usr/sbin/zpool", "list", "-H"]), ["zpool", "list"]);
  assert.deepEqual(commandLabels(["mount"]), ["mount", "list"]);
  assert.deepEqual(commandLabels(["mount", "-c", "--bind", "/a", "/b"]), ["mount", "bind"]);
  assert.deepEqual(commandLabels(["mount", "-o", "remount,bind,ro", "/b"]), ["mount", "remount"]);
  assert.deepEqual(commandLabels(["mount", "-t", "zfs", "tank/v", "/s"]), ["mount", "mount"]);
  assert.deepEqual(commandLabels(["umount", "/local/csi/x"]), ["umount", "umount"]);
  assert.deepEqual(commandLabels(["zfs", "tank/strange name"]), ["zfs", "other"]);
  assert.deepEqual(commandLabels(["/opt/My Tools/ZFS.bin", "get"]), ["other", "get"]);
  assert.deepEqual(commandLabels([]), ["other", "other"]);
});

Deno.test("Activity counts processes, failures (non-zero or killed) and their durations", () => {
  const a = new Activity();
  a.observeCommand({ argv: ["zfs", "get", "x"], code: 0, killed: false, seconds: 0.004 });
  a.observeCommand({ argv: ["zfs", "get", "y"], code: 1, killed: false, seconds: 0.02 });
  a.observeCommand({ argv: ["zfs", "send", "s"], code: 0, killed: true, seconds: 400 });
  const text = render(a.families());
  assert.match(text, /^zfs_csi_commands_total\{program="zfs",subcommand="get"\} 2$/m);
  assert.match(text, /^zfs_csi_command_failures_total\{program="zfs",subcommand="get"\} 1$/m);
  assert.match(text, /^zfs_csi_command_failures_total\{program="zfs",subcommand="send"\} 1$/m);
  assert.match(
    text,
    /^zfs_csi_command_duration_seconds_bucket\{program="zfs",subcommand="get",le="0\.005"\} 1$/m,
  );
  assert.match(
    text,
    /^zfs_csi_command_duration_seconds_bucket\{program="zfs",subcommand="send",le="300"\} 0$/m,
  );
  assert.match(
    text,
    /^zfs_csi_command_duration_seconds_count\{program="zfs",subcommand="send"\} 1$/m,
  );
});

Deno.test("Activity counts calls by method and code, and backups by volume", () => {
  const a = new Activity();
  a.observeCall("CreateVolume", "OK", 0.3);
  a.observeCall("CreateVolume", "ALREADY_EXISTS", 0.01);
  a.observeBackup("pg", "stored");
  a.observeBackup("pg", "failed");
  a.observeSent("pg", 8 * 1024 * 1024);
  a.observeSent("pg", 1024);
  const text = render(a.families());
  assert.match(text, /^zfs_csi_grpc_calls_total\{method="CreateVolume",code="OK"\} 1$/m);
  assert.match(
    text,
    /^zfs_csi_grpc_calls_total\{method="CreateVolume",code="ALREADY_EXISTS"\} 1$/m,
  );
  assert.match(text, /^zfs_csi_grpc_call_duration_seconds_count\{method="CreateVolume"\} 2$/m);
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="failed"\} 1$/m);
  assert.match(text, /^zfs_csi_backup_sent_bytes_total\{volume="pg"\} 8389632$/m);
});

Deno.test("Activity's counters exist at 0 from the start, and a volume's once declared", () => {
  const a = new Activity(() => Date.parse("2026-03-01T12:00:00Z"));
  a.declareMethods(["Probe", "CreateVolume"]);
  let text = render(a.families());
  assert.match(text, /^zfs_csi_commands_total\{program="zfs",subcommand="send"\} 0$/m);
  assert.match(text, /^zfs_csi_command_failures_total\{program="zpool",subcommand="list"\} 0$/m);
  assert.match(text, /^zfs_csi_grpc_calls_total\{method="CreateVolume",code="OK"\} 0$/m);
  assert.doesNotMatch(text, /zfs_csi_backups_total\{/);
  a.declareVolumes(["pg"]);
  text = render(a.families());
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="stored"\} 0$/m);
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="failed"\} 0$/m);
  assert.match(text, /^zfs_csi_backup_sent_bytes_total\{volume="pg"\} 0$/m);
  assert.match(text, /^zfs_csi_volume_last_failed_backup_timestamp_seconds\{volume="pg"\} 0$/m);
  a.observeBackup("pg", "failed");
  a.declareVolumes(["pg"]);
  text = render(a.families());
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="failed"\} 1$/m);
  assert.match(
    text,
    /^zfs_csi_volume_last_failed_backup_timestamp_seconds\{volume="pg"\} 1772366400$/m,
  );
});
