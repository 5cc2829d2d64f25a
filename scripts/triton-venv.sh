#!/usr/bin/env bash
# A cached venv holding the real Triton 3.6.0 wheel (no deps: enough for Triton's own ptxas
# pick, `triton.backends.nvidia.compiler`), used by the toolchain tests and the triton role's
# host test. scripts/test.sh runs this in set-up so a cold run downloads before pytest.
#
#   scripts/triton-venv.sh      build (once) and print the venv's python
#
# Environment: DDTREE_CACHE (default /var/cache/ddtree-ops).
set -euo pipefail
CACHE="${DDTREE_CACHE:-/var/cache/ddtree-ops}"
PYTHON="${PYTHON:-python3}"
VERSION=3.6.0
wheels="$CACHE/ptxas-wheels"
venv="$CACHE/triton-venv/$VERSION"
if [[ ! -f $venv/.complete ]]; then
  mkdir -p "$wheels" "$CACHE/triton-venv"
  exec 9>"$CACHE/triton-venv/.lock"
  flock 9
  if [[ ! -f $venv/.complete ]]; then
    # The host test copies this cp311 wheel to the Debian 12 test host (Python 3.11).
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.11 --platform manylinux_2_28_x86_64 "triton==$VERSION" -d "$wheels"
    "$PYTHON" -m venv --clear "$venv"
    "$venv/bin/pip" install -q --no-deps --no-index --disable-pip-version-check "$wheels"/triton-"$VERSION"-cp311-*.whl
    touch "$venv/.complete"
  fi
fi
printf '%s\n' "$venv/bin/python"
