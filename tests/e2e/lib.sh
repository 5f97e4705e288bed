# Shared by the end-to-end scripts in tests/e2e (sourced, not run): printed checks, waiting, free
# ports, the plugin wrapper for raw_exec and the exec driver's chroot. Each function is small and
# self-contained; the sourcing script sets passed=0 and failed=0 before its first check and
# prints its own closing line.
# shellcheck shell=bash

# The checkout these scripts belong to (its tools/deno runs the wrapper below).
E2E_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

say() { printf '%s\n' "$*"; }
step() { say ""; say "== $*"; }
pass() { passed=$((passed + 1)); say "ok   $*"; }
fail() { failed=$((failed + 1)); say "FAIL $*"; }
# A failed check after which the run cannot go on (the EXIT trap cleans up).
abort() {
  fail "$*"
  exit 1
}

# check "what" command...: one check, passed if the command succeeds.
check() {
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

# same a b: equal and not empty (an empty output on both sides proves nothing).
same() { [ -n "$1" ] && [ "$1" = "$2" ]; }

# wait_until seconds command...: polls every second until the command succeeds.
wait_until() {
  local deadline=$(($(date +%s) + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 1
  done
}

# port_free port: nothing listens on 127.0.0.1:port.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_ports count: prints the first of `count` consecutive free ports, outside Nomad's defaults
# (4646-4648) and its dynamic range (20000-32000).
free_ports() {
  local base i ok
  for _ in $(seq 1 50); do
    base=$((34000 + (RANDOM % 2000) * $1))
    [ "$((base + $1))" -lt 60000 ] || continue
    ok=1
    for i in $(seq 0 $(($1 - 1))); do port_free $((base + i)) || { ok=""; break; }; done
    [ -n "$ok" ] && { echo "$base"; return 0; }
  done
  return 1
}

# plugin_wrapper out plugin-root dirs extra-dirs store-hosts: writes an executable `out` that
# runs plugin-root's main.ts under the pinned Deno with the production permission flags
# (src/permissions.ts) for the colon-separated `dirs`, widened as a build with
# ZFS_CSI_EXTRA_DIRS=extra-dirs and ZFS_CSI_STORE_HOSTS=store-hosts would be (needsFromVariables in src/permissions.ts;
# "" for none): what the compiled binary does, since "deno compile" cannot run on these machines.
plugin_wrapper() {
  local out=$1 plugin_root=$2 flags
  flags=$(cd "$plugin_root" && E2E_DIRS="$3" ZFS_CSI_EXTRA_DIRS="$4" ZFS_CSI_STORE_HOSTS="$5" \
    "$E2E_ROOT/tools/deno" eval --quiet '
    const { needsFromVariables, runtimeFlags } = await import(`${Deno.cwd()}/src/permissions.ts`);
    const build = needsFromVariables({
      ZFS_CSI_EXTRA_DIRS: Deno.env.get("ZFS_CSI_EXTRA_DIRS"),
      ZFS_CSI_STORE_HOSTS: Deno.env.get("ZFS_CSI_STORE_HOSTS"),
    });
    const dirs = [...Deno.env.get("E2E_DIRS")!.split(":"), ...build.extraDirs];
    const scope = { dirs, netHosts: build.storeHosts };
    await Deno.stdout.write(new TextEncoder().encode(runtimeFlags(scope).join(" ")));
  ') || return 1
  mkdir -p "$(dirname "$out")" || return 1
  cat >"$out" <<EOF
#!/bin/sh
# Runs zfs-csi from source as the compiled binary would run (its flags from src/permissions.ts).
cd '$plugin_root' || exit 1
export DENO_DIR='${DENO_DIR:-$HOME/.cache/deno}'
exec '$E2E_ROOT/tools/deno' run --quiet --frozen --config deno.json $flags main.ts "\$@"
EOF
  chmod +x "$out"
}

# chroot_env_entries program...: the lines of a Nomad client's chroot_env block that copy these
# programs (as /bin/<name>), their libraries, and /etc/passwd and /etc/group (a task running as
# nobody must resolve its user) into every exec task.
chroot_env_entries() {
  local entries="" prog path lib
  for prog in "$@"; do
    path=$(readlink -f "$(command -v "$prog")") || return 1
    entries+="    \"$path\" = \"/bin/$prog\""$'\n'
    for lib in $(ldd "$path" | grep -o '/[^ ]*'); do
      entries+="    \"$(readlink -f "$lib")\" = \"$lib\""$'\n'
    done
  done
  entries+='    "/etc/passwd" = "/etc/passwd"'$'\n''    "/etc/group" = "/etc/group"'
  printf '%s\n' "$entries" | sort -u
}

# spec_from source target sed-expression...: the shipped file nomad/<source> copied to
# $tmp/<target> with the edits, each of which must have changed something (a shipped file that
# drifted should fail here, not later).
spec_from() {
  local src="$E2E_ROOT/nomad/$1" dst="$tmp/$2" e before
  shift 2
  cp "$src" "$dst" || return 1
  for e in "$@"; do
    before=$(cat "$dst")
    sed -i "$e" "$dst"
    [ "$before" != "$(cat "$dst")" ] || { say "  edit '$e' changed nothing in $src"; return 1; }
  done
}

# pids_of cmdline-part fd-dir...: processes (not this shell) whose command line contains
# cmdline-part, or that hold a file open below one of the fd-dirs (Nomad's logmon and executors,
# which outlive an agent).
pids_of() {
  local part=$1 p d
  shift
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$part"; then
      echo "${p#/proc/}"
      continue
    fi
    for d in "$@"; do
      if find "$p/fd" -maxdepth 1 -lname "$d/*" 2>/dev/null | grep . >/dev/null; then
        echo "${p#/proc/}"
        break
      fi
    done
  done
}

# finish_run name pool: the end of a run's cleanup, once its agents are stopped. Unmounts what is
# left below $tmp (not the pool's own mounts below $tmp/zfs: zpool destroy does those), destroys
# the pool, removes $tmp unless E2E_KEEP=1, prints the summary line and exits: 1 when a check
# failed or the script ended with an error ($code), else 0.
finish_run() {
  local name=$1 pool=$2
  findmnt -rn -o TARGET | grep -F "$tmp/" | grep -vF "$tmp/zfs" | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  for _ in $(seq 1 20); do
    zpool destroy -f "$pool" 2>/dev/null && break
    zpool list -H "$pool" >/dev/null 2>&1 || break
    sleep 0.5
  done
  zpool list -H "$pool" >/dev/null 2>&1 && say "could not destroy pool $pool: zpool destroy -f $pool"
  if [ "${E2E_KEEP:-}" = 1 ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
  say ""
  say "took $(($(date +%s) - started_at))s under ${nomad_version:-Nomad (not started)}"
  say "$name: $passed checks passed, $failed failed${nomad_version:+ ($nomad_version)}"
  if [ "$failed" -gt 0 ] || [ "$code" -ne 0 ]; then exit 1; fi
  exit 0
}
