#!/usr/bin/env bash
# Test hosts for ddtree-ops: real systemd machines (Debian 12 rootfs built once with
# debootstrap, booted with `systemd-nspawn --boot --volatile=overlay`), each in its own
# network namespace, reachable from the root namespace over SSH as root.
#
#   scripts/testhost.sh build            build the cached rootfs (once; reused afterwards)
#   scripts/testhost.sh up [N]           boot ddt-th1..ddt-thN (default 1) and wait for SSH
#   scripts/testhost.sh down             stop all test hosts, remove their namespaces
#   scripts/testhost.sh status           one line per host; exit 0 if all up, 3 otherwise
#   scripts/testhost.sh ssh NAME [cmd]   ssh into a host as root
#
# Host ddt-thI lives in network namespace ddt-thI; veth ddt-thI (root ns, 10.213.I.1/30)
# <-> host0 (container, 10.213.I.2/30). There is no default route inside: no internet.
#
# Environment:
#   DDTREE_TESTHOST_ROOTFS   cached rootfs (default /var/cache/ddtree-ops/rootfs-bookworm-vN,
#                            N = ROOTFS_VERSION, so checkouts of different recipes coexist)
#   DDTREE_TESTHOST_RUNDIR   machine-wide runtime state: pids, authorized_keys
#                            (default /run/ddtree-ops/testhost)
#   DDTREE_TESTHOST_MIRROR   Debian mirror (default: taken from /etc/apt/sources.list*)
#   DDTREE_TESTHOST_TIMEOUT  seconds to wait for each host in `up` (default 60)
#
# Needs root, debootstrap, systemd-container, iproute2, openssh-client; the kernel needs
# overlayfs and network namespaces. Systemd on the host is NOT needed (no machined).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNDIR="${DDTREE_TESTHOST_RUNDIR:-/run/ddtree-ops/testhost}"
TIMEOUT="${DDTREE_TESTHOST_TIMEOUT:-60}"
STATUS_TIMEOUT=10   # seconds one host's status probe may take (cmd_status)
STATE_DIR="$REPO_ROOT/.state"
KEY="$STATE_DIR/ssh/id_ed25519"
LOG_DIR="$STATE_DIR/testhost"
AUTH_KEYS="$RUNDIR/authorized_keys"
SUITE=bookworm
MARKER_NAME=.ddtree-testhost-complete
ROOTFS_VERSION=3   # bump when the rootfs recipe changes: builds a new rootfs beside the old
ROOTFS="${DDTREE_TESTHOST_ROOTFS:-/var/cache/ddtree-ops/rootfs-bookworm-v$ROOTFS_VERSION}"
MAX_HOSTS=20
PACKAGES=(
  systemd systemd-sysv dbus libpam-systemd libnss-myhostname openssh-server
  python3 python3-venv python3-pip python3-apt
  iproute2 ca-certificates sudo procps curl
  # the monitoring host role deploys scrape config and rules to a real Prometheus
  prometheus
)
# Units that cannot work in a container without internet, or that only add noise.
MASKED_UNITS=(
  systemd-networkd-wait-online.service
  apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service
  e2scrub_all.timer e2scrub_reap.service fstrim.timer man-db.timer
  systemd-timesyncd.service systemd-firstboot.service
  # /etc/machine-id is a per-host bind mount; there is nothing to commit.
  systemd-machine-id-commit.service
)

SSH_OPTS=(
  -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR
  -o BatchMode=yes -o ConnectTimeout=3 -o IdentitiesOnly=yes
)

log() { printf 'testhost: %s\n' "$*" >&2; }
die() { printf 'testhost: error: %s\n' "$*" >&2; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces, nspawn)"; }

need_cmds() {
  local c missing=()
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  ((${#missing[@]} == 0)) || die "missing commands: ${missing[*]} (apt-get install debootstrap systemd-container iproute2 openssh-client)"
}

host_ip() { printf '10.213.%d.2' "$1"; }
gw_ip() { printf '10.213.%d.1' "$1"; }
name_of() { printf 'ddt-th%d' "$1"; }
pidfile() { printf '%s/%s.pid' "$RUNDIR" "$(name_of "$1")"; }

# "ddt-th3" -> 3
index_of() {
  [[ $1 =~ ^ddt-th([0-9]+)$ ]] || die "unknown host name '$1' (expected ddt-thN)"
  printf '%d' "${BASH_REMATCH[1]}"
}

# --------------------------------------------------------------------------- build

detect_mirror() {
  if [[ -n ${DDTREE_TESTHOST_MIRROR:-} ]]; then printf '%s' "$DDTREE_TESTHOST_MIRROR"; return; fi
  local f uri=""
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    uri=$(awk '
      /^[[:space:]]*#/ { next }
      /^deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }
      /^URIs:/ { for (i = 2; i <= NF; i++) print $i }
    ' "$f" | grep -E '://[^ ]*/debian/?$' | head -n1 || true)
    [[ -n $uri ]] && break
  done
  printf '%s' "${uri:-http://deb.debian.org/debian}"
}

rootfs_complete() { [[ -f $ROOTFS/$MARKER_NAME ]] && grep -qx "version=$ROOTFS_VERSION" "$ROOTFS/$MARKER_NAME"; }

safe_rm_rf() {
  local p=$1
  [[ -n $p && $p == /*/* && $p != *..* ]] || die "refusing to remove suspicious path '$p'"
  rm -rf --one-file-system -- "$p"
}

cmd_build() {
  need_root
  need_cmds debootstrap chroot
  if rootfs_complete; then
    log "rootfs already built: $ROOTFS (delete it to rebuild)"
    return 0
  fi
  if any_running; then die "test hosts are running on the old rootfs; run '$0 down' first"; fi
  local mirror partial="$ROOTFS.partial"
  mirror=$(detect_mirror)
  [[ -e $ROOTFS ]] && { log "removing incomplete/outdated rootfs $ROOTFS"; safe_rm_rf "$ROOTFS"; }
  [[ -e $partial ]] && { log "removing interrupted build $partial"; safe_rm_rf "$partial"; }
  mkdir -p "$(dirname "$ROOTFS")"
  log "debootstrap $SUITE from $mirror into $partial (a few minutes)"
  local pkgs
  pkgs=$(IFS=,; printf '%s' "${PACKAGES[*]}")
  if ! debootstrap --variant=minbase --components=main --include="$pkgs" \
        "$SUITE" "$partial" "$mirror" >"$partial.debootstrap.log" 2>&1; then
    tail -n 30 "$partial.debootstrap.log" >&2 || true
    die "debootstrap failed; full log: $partial.debootstrap.log"
  fi
  log "configuring rootfs"
  configure_rootfs "$partial"
  printf 'version=%s\nsuite=%s\nmirror=%s\nbuilt=%s\n' \
    "$ROOTFS_VERSION" "$SUITE" "$mirror" "$(date -u +%FT%TZ)" >"$partial/$MARKER_NAME"
  mv -T "$partial" "$ROOTFS"
  rm -f "$partial.debootstrap.log"
  log "rootfs ready: $ROOTFS ($(du -sh --one-file-system "$ROOTFS" | cut -f1))"
}

configure_rootfs() {
  local r=$1 u
  # Hostname comes from nspawn (--hostname) per host; no baked /etc/hostname.
  rm -f "$r/etc/hostname"
  printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
  # A machine-id is bind-mounted per host at `up`; keep a valid placeholder so the
  # boot is never a "first boot" (which would run preset-all and firstboot prompts).
  tr -d '-' </proc/sys/kernel/random/uuid >"$r/etc/machine-id"
  # Root's authorized_keys is bind-mounted at `up`, so each clone's key works.
  install -d -m 0700 "$r/root/.ssh"
  : >"$r/root/.ssh/authorized_keys"; chmod 0600 "$r/root/.ssh/authorized_keys"
  install -d -m 0755 "$r/etc/ssh/sshd_config.d"
  cat >"$r/etc/ssh/sshd_config.d/ddtree-testhost.conf" <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOF
  for u in "${MASKED_UNITS[@]}"; do ln -sfn /dev/null "$r/etc/systemd/system/$u"; done
  # Installed but not started at boot: the monitoring role configures and enables it.
  rm -f "$r/etc/systemd/system/multi-user.target.wants/prometheus.service"
  # The console is read-only (nspawn runs in the background); no getty on it.
  ln -sfn /dev/null "$r/etc/systemd/system/console-getty.service"
  # Shorter stop timeouts make `down` fast.
  install -d "$r/etc/systemd/system.conf.d"
  printf '[Manager]\nDefaultTimeoutStopSec=10s\n' >"$r/etc/systemd/system.conf.d/ddtree-testhost.conf"
  # The journal stays in memory (volatile overlay anyway).
  install -d "$r/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' >"$r/etc/systemd/journald.conf.d/ddtree-testhost.conf"
  chroot "$r" apt-get clean
  rm -rf "$r/var/lib/apt/lists/"*_Packages "$r/var/log/"*.log
}

# --------------------------------------------------------------------------- runtime

ensure_key() {
  if [[ ! -f $KEY ]]; then
    install -d -m 0700 "$(dirname "$KEY")"
    ssh-keygen -q -t ed25519 -N '' -C "ddtree-ops-testhost@$(hostname)" -f "$KEY"
    log "generated SSH key $KEY"
  fi
  install -d -m 0755 "$RUNDIR"
  [[ -f $AUTH_KEYS ]] || install -m 0600 /dev/null "$AUTH_KEYS"
  # Append in place (never replace the file): running hosts bind-mount this inode,
  # so a new clone's key becomes valid on hosts that are already up.
  local pub; pub=$(cut -d' ' -f1,2 "$KEY.pub")
  grep -qF "$pub" "$AUTH_KEYS" || cat "$KEY.pub" >>"$AUTH_KEYS"
}

nspawn_pid() { # prints the pid of host $1's nspawn if it is running
  local f pid; f=$(pidfile "$1")
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "systemd-nspawn .*--machine=$(name_of "$1") " || return 1
  printf '%s' "$pid"
}

known_indices() { # hosts with any state: pid file or network namespace
  {
    find "$RUNDIR" -maxdepth 1 -name 'ddt-th*.pid' -printf '%f\n' 2>/dev/null |
      sed -n 's/^ddt-th\([0-9]\+\)\.pid$/\1/p'
    ip netns list 2>/dev/null | sed -n 's/^ddt-th\([0-9]\+\)\b.*/\1/p'
  } | sort -n -u
}

any_running() { local i; for i in $(known_indices); do nspawn_pid "$i" >/dev/null && return 0; done; return 1; }

ssh_host() { # ssh_host I [cmd...]
  local i=$1; shift
  ssh "${SSH_OPTS[@]}" -i "$KEY" "root@$(host_ip "$i")" "$@"
}

ssh_ok() { ssh_host "$1" true </dev/null >/dev/null 2>&1; }

setup_netns() {
  local i=$1 n; n=$(name_of "$1")
  teardown_netns "$i"
  ip netns add "$n"
  ip link add "$n" type veth peer name host0 netns "$n"
  ip addr add "$(gw_ip "$i")/30" dev "$n"
  ip link set "$n" up
  ip -n "$n" link set lo up
  ip -n "$n" addr add "$(host_ip "$i")/30" dev host0
  ip -n "$n" link set host0 up
}

# Host pids of container inits (PID 1 of a pid namespace) living in network namespace $1.
netns_inits() {
  local ns=/run/netns/$1 ino p
  [[ -e $ns ]] || return 0
  ino=$(stat -L -c %i "$ns")
  for p in /proc/[0-9]*; do
    [[ $(stat -L -c %i "$p/ns/net" 2>/dev/null) == "$ino" ]] || continue
    awk '/^NSpid:/ { if (NF > 2 && $NF == 1) found = 1 } END { exit !found }' "$p/status" 2>/dev/null &&
      printf '%s\n' "${p#/proc/}"
  done
  return 0
}

teardown_netns() {
  local n p; n=$(name_of "$1")
  # A container whose nspawn was killed (SIGKILL, OOM) keeps running on its own; kill
  # its init (and with it the whole pid namespace) before the namespace is forgotten.
  for p in $(netns_inits "$n"); do
    log "$n: killing orphaned container init (pid $p)"
    kill -KILL "$p" 2>/dev/null || true
  done
  if ip netns list | grep -qw "^$n"; then ip netns delete "$n"; fi
  if ip link show "$n" >/dev/null 2>&1; then ip link delete "$n"; fi
}

start_host() {
  local i=$1 n machine_id; n=$(name_of "$1")
  setup_netns "$i"
  machine_id=$(printf 'ddtree-testhost-%s' "$n" | md5sum | cut -c1-32)
  printf '%s\n' "$machine_id" >"$RUNDIR/$n.machine-id"
  mkdir -p "$LOG_DIR"
  log "booting $n ($(host_ip "$i")), log: ${LOG_DIR#"$REPO_ROOT"/}/$n.log"
  # --register=no --keep-unit: no machined / systemd needed on the host.
  # --volatile=overlay: writes go to a tmpfs overlay; the cached rootfs is never modified.
  setsid systemd-nspawn \
    --quiet --boot --volatile=overlay --directory="$ROOTFS" \
    --machine="$n" --hostname="$n" --register=no --keep-unit \
    --network-namespace-path="/run/netns/$n" \
    --bind-ro="$AUTH_KEYS:/root/.ssh/authorized_keys" \
    --bind-ro="$RUNDIR/$n.machine-id:/etc/machine-id" \
    --console=read-only --link-journal=no --resolv-conf=off --timezone=off \
    --setenv=SYSTEMD_COLORS=0 --setenv=SYSTEMD_LOG_COLOR=0 \
    </dev/null >"$LOG_DIR/$n.log" 2>&1 &
  printf '%s\n' "$!" >"$(pidfile "$i")"
}

wait_host() { # wait until ssh answers and the boot finished; report degraded units
  local i=$1 n state deadline; n=$(name_of "$1")
  deadline=$((SECONDS + TIMEOUT))
  until ssh_ok "$i"; do
    if ! nspawn_pid "$i" >/dev/null; then
      tail -n 20 "$LOG_DIR/$n.log" >&2 2>/dev/null || true
      die "$n: systemd-nspawn exited during boot (log: $LOG_DIR/$n.log)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 20 "$LOG_DIR/$n.log" >&2 2>/dev/null || true
      die "$n: SSH on $(host_ip "$i") not answering after ${TIMEOUT}s (log: $LOG_DIR/$n.log)"
    fi
    sleep 0.3
  done
  local left=$((deadline - SECONDS)); ((left > 5)) || left=5
  state=$(ssh_host "$i" "timeout $left systemctl is-system-running --wait" </dev/null 2>/dev/null || true)
  case $state in
    running) log "$n up: $(host_ip "$i") (running)" ;;
    degraded)
      log "$n up: $(host_ip "$i") (degraded); failed units:"
      ssh_host "$i" systemctl --failed --no-legend --plain </dev/null | sed 's/^/    /' >&2 || true ;;
    *) die "$n: SSH answers but system state is '${state:-unknown}' after ${TIMEOUT}s" ;;
  esac
}

cmd_up() {
  local n=${1:-1} i started=()
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_HOSTS)); then
    die "up: N must be 1..$MAX_HOSTS, got '$n'"
  fi
  need_root
  need_cmds systemd-nspawn ip ssh ssh-keygen setsid
  rootfs_complete || cmd_build
  ensure_key
  for ((i = 1; i <= n; i++)); do
    if nspawn_pid "$i" >/dev/null; then
      if ssh_ok "$i"; then log "$(name_of "$i") already up: $(host_ip "$i")"; continue; fi
      started+=("$i")   # still booting (or wedged): wait for it below
      continue
    fi
    start_host "$i"
    started+=("$i")
  done
  for i in "${started[@]}"; do wait_host "$i"; done
}

stop_host() {
  local i=$1 n pid t; n=$(name_of "$1")
  if pid=$(nspawn_pid "$i"); then
    # nspawn forwards SIGTERM to the container's init as its --kill-signal (SIGRTMIN+3
    # with --boot): a clean halt, after which nspawn exits.
    kill -TERM "$pid" 2>/dev/null || true
    for ((t = 0; t < 150; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$n did not halt within 30s; killing"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
    log "$n stopped"
  fi
  rm -f "$(pidfile "$i")" "$RUNDIR/$n.machine-id"
  # nspawn leaves this directory behind when /run is not a tmpfs (it refuses to rm -rf
  # on a disk file system); remove it unless something is still mounted there.
  local prop=/run/systemd/nspawn/propagate/$n
  if [[ -d $prop ]] && ! findmnt -rn -T "$prop" -o TARGET | grep -qx "$prop"; then
    rm -rf --one-file-system -- "$prop"
  fi
  teardown_netns "$i"
}

cmd_down() {
  need_root
  local i idx; idx=$(known_indices)
  if [[ -z $idx ]]; then log "no test hosts running"; return 0; fi
  for i in $idx; do stop_host "$i"; done
  # the stand-in NVIDIA repository served for them (scripts/testhost-standins.sh), if any
  bash "$REPO_ROOT/scripts/testhost-standins.sh" down || true
}

# One host's status line. The probe is bounded (STATUS_TIMEOUT): ConnectTimeout covers only the
# TCP connect, and a host whose sshd or PID 1 stalls after accepting the connection (seen once
# under a loaded CI run) would otherwise hang the whole report, and with it every host test.
status_line() {
  local i=$1 n state pid; n=$(name_of "$i")
  if ! pid=$(nspawn_pid "$i"); then printf '%s down\n' "$n"; return 3; fi
  state=$(timeout -k 2 "$STATUS_TIMEOUT" \
    ssh "${SSH_OPTS[@]}" -o ServerAliveInterval=2 -o ServerAliveCountMax=2 -i "$KEY" \
    "root@$(host_ip "$i")" systemctl is-system-running </dev/null 2>/dev/null || true)
  if [[ -z $state ]]; then
    printf '%s booting-or-unreachable %s pid=%s\n' "$n" "$(host_ip "$i")" "$pid"; return 3
  fi
  printf '%s up %s pid=%s state=%s\n' "$n" "$(host_ip "$i")" "$pid" "$state"
}

cmd_status() {
  local i idx rc=0 tmp
  idx=$(known_indices)
  [[ -n $idx ]] || idx=1
  # Probed side by side, printed in host order: the report takes one probe's bound, not N.
  tmp=$(mktemp -d)
  for i in $idx; do
    { if status_line "$i" >"$tmp/$i.out"; then echo 0; else echo 3; fi >"$tmp/$i.rc"; } &
  done
  wait
  for i in $idx; do
    cat "$tmp/$i.out"
    [[ $(<"$tmp/$i.rc") == 0 ]] || rc=3
  done
  rm -rf -- "$tmp"
  return $rc
}

cmd_ssh() {
  (($# >= 1)) || die "usage: $0 ssh NAME [cmd...]"
  local i; i=$(index_of "$1"); shift
  [[ -f $KEY ]] || die "no SSH key at $KEY; run '$0 up' first"
  exec ssh "${SSH_OPTS[@]}" -i "$KEY" "root@$(host_ip "$i")" "$@"
}

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

main() {
  local cmd=${1:-}; shift || true
  case $cmd in
    build) cmd_build "$@" ;;
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    ssh) cmd_ssh "$@" ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
