#!/usr/bin/env bash
# Build (once per source state) the wheelhouse that hosts install ddtree-ops from, so GPU
# hosts need no internet. Prints the wheelhouse directory on the last line of stdout.
#
#   scripts/build-wheelhouse.sh OUT_DIR [PYTHON]
#
# The directory is OUT_DIR/<cpXY>-<ops_wheelhouse_id: pyproject.toml + ddtree_ops/**.py> so an unchanged
# source tree reuses the same bytes (deploys stay idempotent). Wheels are built for PYTHON
# (default: the python running this script), i.e. the controller's CPython version.
set -euo pipefail
out=${1:?usage: build-wheelhouse.sh OUT_DIR [PYTHON]}
py=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
# one definition of the id: ddtree_ops.config.build_id.ops_wheelhouse_id (pyproject.toml + the package's code)
hash=$(cd "$root" && "$py" -m ddtree_ops.sglang.wheelhouse --ops-wheelhouse-id --root "$root")
[[ "$hash" =~ ^[0-9a-f]{12}$ ]] || { echo "build-wheelhouse: no wheelhouse id from $py -m ddtree_ops.sglang.wheelhouse --ops-wheelhouse-id: $hash" >&2; exit 1; }
# the CPython tag of $py, as ddtree_ops/python_tag.py defines it (standard library only)
tag=$(cd "$root" && "$py" -m ddtree_ops.python_tag)
dir="$out/$tag-$hash"
if [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  echo "building wheelhouse $dir" >&2
  "$py" -m pip wheel --quiet --disable-pip-version-check -w "$dir.tmp" "$root" >&2
  touch "$dir.tmp/.complete"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  echo "changed" >&2
fi
echo "$dir"
