#!/usr/bin/env bash
# Runs at boot inside the OpenZFS VM (zfs-csi-vm-test.service): the project's test suite, then
# OpenZFS's output of the commands behind tests/fixtures. The unit powers the VM off afterwards.
# Everything lands in /opt/zfs-csi-vm/results on the VM disk; openzfs-vm.sh copies it out.
# The VM has no network: openzfs-vm.sh puts the project, Deno, its caches and Go in beforehand.
set -euo pipefail

vm=/opt/zfs-csi-vm
out=$vm/results
rm -rf "$out"
mkdir -p "$out"
# Console (the host's console.log) and run.log both get everything.
exec > >(tee -a "$out/run.log") 2>&1
tee_pid=$!
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Go and the go_client modules, when the host had them (the grpc-go churn test); offline.
# -trimpath on both sides keeps the build cache made on the host valid at this path.
if [ -x /usr/local/go/bin/go ] && [ -d "$vm/go/mod" ]; then
  export PATH=$PATH:/usr/local/go/bin GOMODCACHE=$vm/go/mod GOCACHE=$vm/go/build \
    GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -trimpath"
fi

step() { printf '=== %s\n' "$*"; }

# Exits (and the unit powers off) when the module is missing: nothing below would mean anything.
modprobe zfs

# Packages an image built before they were in the build's list lacks (block volumes: xfsprogs),
# brought from the host's cache by openzfs-vm.sh; only those not installed, offline.
if compgen -G "$vm/debs/*.deb" >/dev/null; then
  debs=()
  for d in "$vm"/debs/*.deb; do
    pkg="$(dpkg-deb -f "$d" Package)"
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || debs+=("$d")
  done
  if [ "${#debs[@]}" -gt 0 ]; then
    # xfsprogs triggers update-initramfs, minutes under TCG for nothing: the VM boots the initrd
    # openzfs-vm.sh copied out at build time, never the image's /boot.
    if [ -f /etc/initramfs-tools/update-initramfs.conf ]; then
      sed -i 's/^update_initramfs=.*/update_initramfs=no/' /etc/initramfs-tools/update-initramfs.conf
    fi
    step "installing ${debs[*]##*/}"
    # Their services (docker, containerd) neither start now nor at later boots: a script starts
    # the daemon it needs, with its own settings, and stops it (tests/e2e/block_nomad_vm.sh).
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    dpkg -i "${debs[@]}" || echo "dpkg -i failed: the tests that need these will fail"
    rm -f /usr/sbin/policy-rc.d
    for d in "${debs[@]}"; do
      for u in $(dpkg-deb -c "$d" | grep -oE '/lib/systemd/system/[^/ ]+\.(service|socket)$' |
        xargs -r -n 1 basename); do
        systemctl disable "$u" 2>/dev/null || true
      done
    done
  fi
fi

step "zfs-csi on OpenZFS, $(date -u)"
cat "$vm/source.txt" 2>/dev/null || true
cd "$vm/project"
{
  echo "debian: $(cat /etc/debian_version)"
  # Which image (the OpenZFS line, ZFS_CSI_VM_OPENZFS); an image built before lines has none.
  cat "$vm/image.txt" 2>/dev/null || echo "openzfs-line: 2.1 (image built before image.txt)"
  echo "kernel: $(uname -r)"
  dpkg-query -W -f 'package: ${Package} ${Version}\n' zfs-dkms zfsutils-linux
  dpkg-query -W -f 'package: ${Package} ${Version}\n' e2fsprogs xfsprogs util-linux 2>&1
  zfs version | sed 's/^/openzfs: /'
  echo "deno: $(./tools/deno --version | head -n 1)"
  if command -v go >/dev/null; then echo "go: $(go env GOVERSION)"; else echo "go: none (grpc-go test skipped)"; fi
} >"$out/versions.txt" 2>&1 || true
cat "$out/versions.txt"
step "zpool list"
zpool list || true

# systemd's daily tmpfiles clean-up first runs 15 min after boot and mounts its credentials
# directory (/run/credentials/...) while it runs: the tests that compare the whole mount table
# before and after (hostile_input_test.ts) would see a mount the plugin never made.
systemctl stop systemd-tmpfiles-clean.timer 2>/dev/null || true

# Load and the busiest processes every 2 min, to tell a slow VM from a stuck test or a leaked
# process. Its own output goes nowhere: an open pipe to tee would hold the end of this script.
(
  while sleep 120; do
    {
      echo "--- $(date -u +%T), up $(cut -d' ' -f1 /proc/uptime) s, load $(cut -d' ' -f1-3 /proc/loadavg)," \
        "deno processes: $(pgrep -c -x deno || true)"
      # top's second frame: CPU use over those 5 s (the first is since each process started).
      top -b -c -n 2 -d 5 -w 220 | awk '/^top -/ { n++ } n == 2' | sed -n '3p;7,18p'
    } >>"$out/load.log"
  done
) >/dev/null 2>&1 &
sampler=$!

# What the host passed: NAME=VALUE lines for the tests (ZFS_CSI_VM_TEST_ENV) and test files to run
# instead of the whole suite (ZFS_CSI_VM_TEST_FILES).
if [ -s "$vm/test.env" ]; then
  while IFS= read -r kv; do
    if [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
      export "$kv"
      echo "test environment: $kv"
    fi
  done <"$vm/test.env"
fi
files=()
if [ -s "$vm/test-files.txt" ]; then mapfile -t files <"$vm/test-files.txt"; fi
# csi-sanity's access types to run it with (ZFS_CSI_VM_SANITY), after the tests.
sanity=()
if [ -s "$vm/sanity.txt" ]; then mapfile -t sanity <"$vm/sanity.txt"; fi

rc=0
if [ "${#files[@]}" -eq 0 ] && { [ "${#sanity[@]}" -gt 0 ] || [ -s "$vm/script.txt" ]; }; then
  step "no test files given: only csi-sanity or the script"
elif [ "${#files[@]}" -gt 0 ]; then
  step "./tools/deno test (integration permissions) ${files[*]}"
  # ZFS_CSI_VM_TEST_FILTER (from ZFS_CSI_VM_TEST_ENV): only the tests whose name it matches.
  NO_COLOR=1 ./tools/deno test --frozen --allow-run --allow-read --allow-write --allow-env \
    --allow-sys --allow-net=127.0.0.1 ${ZFS_CSI_VM_TEST_FILTER:+--filter "$ZFS_CSI_VM_TEST_FILTER"} \
    "${files[@]}" 2>&1 | tee "$out/test.log" || rc=$?
  # The summary line tools/test.sh prints, so the host reads both runs alike.
  awk '/^(ok|FAILED) \| [0-9]+ passed/ {
    for (i = 1; i <= NF; i++) { if ($i == "passed") p += $(i-1); if ($i == "failed") f += $(i-1) }
  } END { printf "tests: %d passed, %d failed\n", p, f }' "$out/test.log" | tee -a "$out/test.log"
else
  step "./tools/deno task test"
  # No Go in the VM: csi-sanity and Nomad (built with Go) run on the host only.
  ZFS_CSI_TEST_PARTS="unit integration" ./tools/deno task test 2>&1 | tee "$out/test.log" || rc=$?
fi
step "tests exit code: $rc"

# csi-sanity as tests/conformance/csi_sanity.sh runs it on the host, with the access type asked
# for; block starts the plugin with --block-volumes (zvols) on a pool with room for them.
for t in ${sanity[@]+"${sanity[@]}"}; do
  step "csi-sanity, access type $t"
  sargs=(-csi.testvolumeaccesstype "$t")
  pargs=()
  # 2 GiB for both: a deleted zvol gives its reservation back when it is set aside, so the block
  # suite's 40 or so deletes of 64 MiB zvols fit (they filled it while set-aside zvols kept theirs).
  pool_mib=2048
  if [ "$t" = block ]; then pargs=(--block-volumes); fi
  src=0
  CSI_SANITY_ARGS="${sargs[*]}" CSI_SANITY_PLUGIN_ARGS="${pargs[*]}" CSI_SANITY_POOL_MIB=$pool_mib \
    NO_COLOR=1 tests/conformance/csi_sanity.sh 2>&1 | tee "$out/sanity-$t.log" || src=$?
  step "csi-sanity ($t) exit code: $src"
  if [ "$src" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$src; fi
done
# A script of the project (ZFS_CSI_VM_SCRIPT), e.g. a transcript under Nomad; its log is the
# transcript, and its exit code counts like the tests'.
if [ -s "$vm/script.txt" ]; then
  script="$(head -n 1 "$vm/script.txt")"
  step "script $script"
  src=0
  NO_COLOR=1 bash "$script" 2>&1 | tee "$out/script.log" || src=$?
  step "script exit code: $src"
  if [ "$src" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$src; fi
fi
echo "$rc" >"$out/test.rc"

# A command expected to fail: its stderr to stderr_NAME.txt, its exit code to exit_codes.txt.
failing() {
  local name=$1 code=0
  shift
  "$@" 2>"$f/stderr_$name.txt" || code=$?
  echo "$name exit $code" >>"$f/exit_codes.txt"
}

# The same commands as tests/fixtures (see its README), under /tmp/t so that paths match the
# committed tests/fixtures/openzfs/. Called with ||, so one failing command does not stop the rest.
capture_fixtures() {
  export LC_ALL=C
  f=$out/fixtures-openzfs
  local d=/tmp/t
  mkdir -p "$f"
  rm -rf "$d"
  mkdir -p "$d"
  truncate -s 512M "$d/pool.img"
  zpool create -m "$d/zfs" tpool "$d/pool.img"
  zfs create tpool/nomad
  zfs create -o refquota=104857600 -o org.zfs-csi:managed=yes tpool/nomad/v1
  zfs create -o refquota=209715200 -o org.zfs-csi:managed=yes 'tpool/nomad/db:5b0:5d'
  zfs get -Hp -o name,property,value,source \
    type,mountpoint,mounted,refquota,used,available,org.zfs-csi:managed \
    tpool/nomad tpool/nomad/v1 'tpool/nomad/db:5b0:5d' >"$f/zfs_get_volumes.txt"
  zfs get -Hp -o name,property,value,source type,mounted,mountpoint tpool/nomad \
    >"$f/zfs_get_parent.txt"
  zpool list -H -o name,health tpool >"$f/zpool_list_health.txt"
  failing get_not_found zfs get -Hp -o name,property,value,source type tpool/nomad/does-not-exist
  failing create_exists zfs create tpool/nomad
  failing create_no_parent zfs create tpool/nomad/does-not-exist/child
  failing zpool_no_such_pool zpool list -H -o name,health nosuchpool
  failing mount_already_mounted zfs mount tpool/nomad
  failing get_bad_property zfs get -Hp -o name,property,value,source bogusprop tpool/nomad

  # What the controller reads and meets: the tree below the parent, clones that block a destroy,
  # an unmount of what is not mounted, values zfs refuses, a key file that is not there.
  zfs snapshot tpool/nomad/v1@snap1
  zfs clone tpool/nomad/v1@snap1 tpool/nomad/c1
  zfs get -Hp -r -d 2 -o name,property,value,source \
    type,creation,referenced,refquota,org.zfs-csi:managed tpool/nomad >"$f/zfs_get_tree.txt"
  failing destroy_snapshot_dependent_clones zfs destroy tpool/nomad/v1@snap1
  failing destroy_filesystem_dependent_clones zfs destroy -r tpool/nomad/v1
  zfs unmount tpool/nomad/c1
  failing unmount_not_mounted zfs unmount tpool/nomad/c1
  failing create_bad_value zfs create -o recordsize=3K tpool/nomad/bad
  failing create_missing_key zfs create -o encryption=on -o keyformat=hex \
    -o keylocation=file:///nonexistent/key tpool/nomad/enc
  zfs destroy tpool/nomad/c1
  zfs destroy tpool/nomad/v1@snap1

  # Bind mounts as the plugin makes them: staging, targets with a space and brackets, one read-only.
  local stage="$d/base/staging/v1/rw" t1="$d/base/per-alloc/a1/db[0]/rw" t2="$d/base/per-alloc/a 2/v1/rw"
  mkdir -p "$stage" "$t1" "$t2"
  mount --bind "$d/zfs/nomad/v1" "$stage"
  mount --bind "$stage" "$t2"
  mount --bind "$d/zfs/nomad/db:5b0:5d" "$t1"
  mount -o remount,bind,ro "$t1"
  mount | grep -F -e tpool -e "$d" >"$f/mount_list_binds.txt"
  grep -F -e tpool -e "$d" /proc/self/mountinfo >"$f/mountinfo_binds.txt"
  # A process inside the target makes umount refuse it. Waited for by pid: a bare `wait` would
  # also wait for the tee behind stdout, forever.
  local busy
  (cd "$t2" && sleep 3) &
  busy=$!
  sleep 1
  failing umount_busy umount "$t2"
  wait "$busy" || true
  umount "$t2" "$t1" "$stage"

  # Zvols as the plugin makes them and asks about them (docs/block-volumes.md): a full one (ext4)
  # and a sparse one (xfs: mkfs.xfs wants 300 MiB); their properties as the controller
  # (ZVOL_STATE, src/csi/volume_kinds/zvol.ts) and the node (NODE_ZVOL_STATE, node_zvol.ts) read
  # them; the reservation after create, and again after none then auto (as a set-aside zvol and
  # its undelete, src/volume/zvol_reservation.ts), and one the pool has no room for; where the
  # /dev/zvol link leads (lsblk as src/block/args.ts asks; exit 32 for a missing link); what
  # zvol_id says of the device; blkid -p of a device empty, after mkfs.ext4 and after mkfs.xfs
  # (with the plugin's flags).
  local z1=tpool/nomad/z1 z2=tpool/nomad/z2 link1=/dev/zvol/tpool/nomad/z1 link2=/dev/zvol/tpool/nomad/z2
  local dev1 dev2 zvol_id=/usr/lib/udev/zvol_id code
  zfs create -V 67108864 -o org.zfs-csi:managed=yes -o org.zfs-csi:fs-type=ext4 "$z1"
  zfs create -s -V 335544320 -o org.zfs-csi:managed=yes -o org.zfs-csi:fs-type=xfs "$z2"
  udevadm settle || true
  for _ in $(seq 120); do [ -e "$link1" ] && [ -e "$link2" ] && break; sleep 0.5; done
  zfs get -Hp -o name,property,value,source \
    type,creation,referenced,refquota,org.zfs-csi:managed,org.zfs-csi:parameters,org.zfs-csi:source,volsize,org.zfs-csi:fs-type,quota,refreservation,mountpoint,org.zfs-csi:name,org.zfs-csi:staged-at,volblocksize,org.zfs-csi:attached \
    "$z1" >"$f/zfs_get_zvol.txt"
  zfs get -Hp -o name,property,value,source \
    type,org.zfs-csi:managed,org.zfs-csi:fs-type,volsize,org.zfs-csi:format,org.zfs-csi:attached,org.zfs-csi:staged-at \
    "$z1" >"$f/zfs_get_zvol_node.txt"
  zfs get -Hp -o name,property,value,source volsize,volblocksize,refreservation,usedbyrefreservation \
    "$z1" "$z2" >"$f/zfs_get_zvol_reservation.txt"
  zfs set refreservation=none "$z1"
  zfs get -Hp -o name,property,value,source refreservation "$z1" >"$f/zfs_get_zvol_reservation_none.txt"
  zfs set refreservation=auto "$z1"
  zfs get -Hp -o name,property,value,source refreservation "$z1" >"$f/zfs_get_zvol_reservation_auto.txt"
  failing set_zvol_refreservation_no_space zfs set refreservation=1099511627776 "$z1"
  lsblk -adnrp -o NAME,MAJ:MIN,TYPE "$link1" >"$f/lsblk_zvol.txt"
  failing lsblk_missing lsblk -adnrp -o NAME,MAJ:MIN,TYPE /dev/zvol/tpool/nomad/none
  dev1=$(readlink -f "$link1")
  dev2=$(readlink -f "$link2")
  [ -x "$zvol_id" ] || zvol_id=/lib/udev/zvol_id
  "$zvol_id" "$dev1" >"$f/zvol_id.txt"
  code=0
  blkid -p -o export "$dev1" >"$f/blkid_empty.txt" || code=$?
  echo "blkid_empty exit $code" >>"$f/exit_codes.txt"
  mkfs.ext4 -q -E nodiscard "$dev1"
  blkid -p -o export "$dev1" >"$f/blkid_ext4.txt"
  mkfs.xfs -q -K "$dev2"
  blkid -p -o export "$dev2" >"$f/blkid_xfs.txt"
  # udev probes the new filesystems too: let it finish before the pool goes.
  udevadm settle || true
  zpool destroy tpool
  rm -rf "$d"
  for x in "$f"/*; do
    echo "--- $(basename "$x")"
    cat "$x"
  done
}
step "OpenZFS counterparts of tests/fixtures (LC_ALL=C), in results/fixtures-openzfs"
capture_fixtures || echo "fixture capture failed (exit $?)"

step "left over: pools, zfs mounts and deno processes (a plugin a test did not stop)"
zpool list || true
mount | grep -w zfs || true
pgrep -a -x deno | cut -c1-300 || true
dmesg >"$out/dmesg.txt" || true
step "done $(date -u)"

kill "$sampler" 2>/dev/null || true
# Let tee write its last lines before the unit ends (systemd then stops what is left).
exec >&- 2>&-
wait "$tee_pid" || true
sync
