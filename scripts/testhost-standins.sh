#!/usr/bin/env bash
# STAND-INS that make a booted test host look like a GPU box to the provisioning roles.
# Test hosts have no GPU and no route to NVIDIA, so:
#
#   * NVIDIA's CUDA apt repository -> scripts/cuda_apt_standin.py (signed, NVIDIA's package
#     names; its cuda-toolkit-X-Y packages hold only the real ptxas of NVIDIA's PyPI wheels),
#     served over HTTP at http://10.213.I.1:8765 for host ddt-thI — for ddt-th1 the address inventory/test gives as
#     cuda_toolkit_repo_url (10.213.1.1 is the root namespace's end of ddt-th1's veth).
#   * the NVIDIA driver's nvidia-smi -> /usr/local/bin/nvidia-smi on the host, a script
#     that answers the driver check's query (ddtree_ops.host.toolkit.QUERY_COMMAND) for 8 GPUs,
#     and for the preflight `-q -x` and `topo -m`: the DERIVED 8x B300 fixtures
#     (tests/fixtures/gpu/derived/b300x8_*, copied to /usr/local/share/ddtree-standin/ with
#     the driver version set). Default: driver 580.159.04 (read off a real H200 host,
#     tests/fixtures/gpu) with compute capability 10.3 (B300: inventory/test deploys the b300
#     host class).
#   * the driver's nvidia-modprobe -> /usr/bin/nvidia-modprobe on the host (the path
#     ddtree-nvidia-devices.service runs), a script that only logs its arguments to the
#     journal and exits 0: there is no driver to load and no GPU to make nodes for, but the
#     device-node unit (and the SGLang unit that Wants= it) must start cleanly.
#
#   scripts/testhost-standins.sh up [N]                   serve the repo, stand-ins on ddt-th1..N (default 1)
#   scripts/testhost-standins.sh down                     stop serving the repo
#   scripts/testhost-standins.sh nvidia-smi HOST DRIVER [CC]   set the stand-in (DRIVER "none": remove it)
#
# Needs the test hosts up (scripts/testhost.sh up) and the project venv (.venv).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNDIR="${DDTREE_TESTHOST_RUNDIR:-/run/ddtree-ops/testhost}"
PORT=8765
PIDFILE="$RUNDIR/cuda-apt-standin.pid"
DEFAULT_DRIVER=580.159.04
DEFAULT_CC=10.3
DERIVED="$REPO_ROOT/tests/fixtures/gpu/derived"
STANDIN_SHARE=/usr/local/share/ddtree-standin

die() { printf 'testhost-standins: error: %s\n' "$*" >&2; exit 1; }
log() { printf 'testhost-standins: %s\n' "$*" >&2; }


nvidia_smi() {
  local host=$1 driver=$2 cc=${3:-$DEFAULT_CC} script
  [[ $driver =~ ^(none|[0-9]+(\.[0-9]+)+)$ ]] || die "DRIVER must be a version like 580.159.04 or 'none', got '$driver'"
  [[ $cc =~ ^[0-9]+\.[0-9]+$ ]] || die "CC must be like 10.3, got '$cc'"
  if [[ $driver == none ]]; then
    bash "$REPO_ROOT/scripts/testhost.sh" ssh "$host" rm -rf /usr/local/bin/nvidia-smi "$STANDIN_SHARE"
    return
  fi
  bash "$REPO_ROOT/scripts/testhost.sh" ssh "$host" "mkdir -p $STANDIN_SHARE"
  sed "s|<driver_version>[^<]*<|<driver_version>$driver<|" "$DERIVED/b300x8_nvidia_smi_q.xml" \
    | bash "$REPO_ROOT/scripts/testhost.sh" ssh "$host" "cat > $STANDIN_SHARE/nvidia-smi-q.xml"
  bash "$REPO_ROOT/scripts/testhost.sh" ssh "$host" "cat > $STANDIN_SHARE/topo-m.txt" < "$DERIVED/b300x8_topo.txt"
  script="#!/bin/sh
# STAND-IN nvidia-smi (ddtree-ops test host; there is no GPU): 8 GPUs, driver $driver, compute capability $cc
case \"\$*\" in
  '-q -x') exec cat $STANDIN_SHARE/nvidia-smi-q.xml ;;
  'topo -m') exec cat $STANDIN_SHARE/topo-m.txt ;;
esac
for i in 1 2 3 4 5 6 7 8; do echo '$driver, $cc'; done"
  bash "$REPO_ROOT/scripts/testhost.sh" ssh "$host" \
    "cat > /usr/local/bin/nvidia-smi <<'EOF'
$script
EOF
chmod 755 /usr/local/bin/nvidia-smi"
}

# Serve the stand-in repository on the root namespace's end of host I's veth (10.213.I.1): each
# test host reaches only its own veth (no route elsewhere).
serve_repo() {
  local i=$1 bind pidfile root
  bind="10.213.$i.1"
  pidfile="$RUNDIR/cuda-apt-standin.pid"
  [[ $i == 1 ]] || pidfile="$RUNDIR/cuda-apt-standin-$i.pid"
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then return; fi
  root=$("$REPO_ROOT/.venv/bin/python" "$REPO_ROOT/scripts/cuda_apt_standin.py" | tail -n 1)
  [[ -d $root/$'debian12/x86_64' ]] || die "stand-in repository not built: $root"
  setsid "$REPO_ROOT/.venv/bin/python" -m http.server --bind "$bind" --directory "$root" "$PORT" \
    >"$RUNDIR/cuda-apt-standin-$i.log" 2>&1 < /dev/null &
  echo $! >"$pidfile"
  for _ in $(seq 50); do
    curl -fsS -o /dev/null "http://$bind:$PORT/debian12/x86_64/Release" 2>/dev/null && break
    sleep 0.1
  done
  curl -fsS -o /dev/null "http://$bind:$PORT/debian12/x86_64/Release" \
    || die "stand-in repository does not answer on $bind:$PORT (log: $RUNDIR/cuda-apt-standin-$i.log)"
  log "stand-in CUDA apt repository on http://$bind:$PORT ($root)"
}

# up [N]: hosts ddt-th1..ddt-thN (default 1), as `testhost.sh up N` booted them.
cmd_up() {
  local n=${1:-1} i
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 20)) || die "up N: N must be 1..20, got '$n'"
  mkdir -p "$RUNDIR"
  for ((i = 1; i <= n; i++)); do
    serve_repo "$i"
    nvidia_smi "ddt-th$i" "$DEFAULT_DRIVER" "$DEFAULT_CC"
    log "stand-in nvidia-smi on ddt-th$i: driver $DEFAULT_DRIVER, compute capability $DEFAULT_CC"
    nvidia_modprobe "ddt-th$i"
    log "stand-in nvidia-modprobe on ddt-th$i (logs only)"
  done
}

nvidia_modprobe() {
  local host=$1 script
  script='#!/bin/sh
# STAND-IN nvidia-modprobe (ddtree-ops test host; no NVIDIA driver, no GPU): logs and succeeds.
echo "STAND-IN nvidia-modprobe (no driver on this test host), would run: nvidia-modprobe $*" >&2
exit 0'
  bash "$REPO_ROOT/scripts/testhost.sh" ssh "$host" \
    "cat > /usr/bin/nvidia-modprobe <<'EOF'
$script
EOF
chmod 755 /usr/bin/nvidia-modprobe"
}

cmd_down() {
  local f
  for f in "$PIDFILE" "$RUNDIR"/cuda-apt-standin-*.pid; do
    [[ -f $f ]] || continue
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  nvidia-smi) shift; [[ $# -ge 2 ]] || die "usage: $0 nvidia-smi HOST DRIVER|none [CC]"; nvidia_smi "$@" ;;
  *) die "usage: $0 up | down | nvidia-smi HOST DRIVER|none [CC]" ;;
esac
