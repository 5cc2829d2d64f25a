#!/usr/bin/env bash
# The test command: set up, lint (scripts/lint.sh: a finding fails the run before any test),
# boot the systemd test hosts, run the tests (pytest, two workers), and stop the hosts again.
# Extra arguments go to pytest; --slow also runs the slow host scenarios (rolling upgrades over
# three hosts, the sweep through four deploys, an interrupted real-SGLang install), as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phase.sh
phase "set up (apt packages, .venv, test-host rootfs)"
bash scripts/setup.sh
phase "lint (ruff, yamllint, ansible-lint)"
bash scripts/lint.sh
# The SGLang wheelhouse is content-keyed: share it across checkouts (~540 MiB download once).
export DDTREE_SGLANG_WHEELHOUSE=${DDTREE_SGLANG_WHEELHOUSE:-/var/cache/ddtree-ops/sglang-wheelhouse}
# Peer tier (tests/peer, real released SGLang): build/reuse its cached venvs and make a
# missing one a failure. DDTREE_PEER=0 scripts/test.sh leaves the tier to skip instead.
if [[ ${DDTREE_PEER:-1} == 1 ]]; then
  phase "peer tier: build or reuse the released-SGLang venvs"
  bash scripts/peer.sh --venvs
  export DDTREE_PEER=1
fi
trap 'phase "stop the test hosts"; bash scripts/testhost.sh down >/dev/null 2>&1 || true; phase "stopped"' EXIT
phase "downloads the tests need (Triton 3.6.0 venv)"
PYTHON=.venv/bin/python bash scripts/triton-venv.sh >/dev/null
# Three hosts: tests/hosts/test_rolling.py rolls an upgrade over three (canary + two untouched).
phase "boot the test hosts (ddt-th1..3)"
bash scripts/testhost.sh up 3
phase "test-host stand-ins (NVIDIA apt repository, nvidia-smi)"
bash scripts/testhost-standins.sh up 3   # NVIDIA apt repo + nvidia-smi stand-ins (no GPU here)
phase "pytest"
rc=0
# Two workers (pytest-xdist): the host tests run in one of them, in order (tests/conftest.py),
# the rest spread over both. DDTREE_TEST_WORKERS=0 runs everything in this process.
workers=${DDTREE_TEST_WORKERS:-2}
[[ $workers =~ ^[0-9]+$ ]] || { echo "test.sh: DDTREE_TEST_WORKERS must be a number, not '$workers'" >&2; exit 2; }
DDTREE_TESTHOSTS=1 .venv/bin/python -m pytest -p no:cacheprovider -ra -n "$workers" --dist loadgroup "$@" || rc=$?
phase "done (pytest rc=$rc)"
exit "$rc"
