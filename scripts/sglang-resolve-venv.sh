#!/usr/bin/env bash
# A cached child venv in which SGLang VERSION's server-args RESOLVER runs without a GPU
# (ServerArgs.resolve_once with --device cuda and a config-only model directory). Used by
# the peer test tier (tests/peer) to compare SGLang's resolved capture list,
# max_running_requests and speculative fields with our plan.
#
#   scripts/sglang-resolve-venv.sh VERSION     build (once) and print the venv's directory
#
# The child venv holds only requirements/sglang-VERSION-resolve.txt (installed --no-deps);
# it sees the shared import-only venv of VERSION (scripts/sglang-venv.sh) through a .pth
# file, and, when the lock says "# torch-from: OTHER", torch/torchvision/triton and their
# CUDA runtime wheels of OTHER's cached venv through a directory of symlinks placed first
# on sys.path. Nothing is copied or changed in the shared venvs.
#
# Environment: DDTREE_SGLANG_VENV_ROOT (default /var/cache/ddtree-ops/sglang-venv).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="${DDTREE_SGLANG_VENV_ROOT:-/var/cache/ddtree-ops/sglang-venv}"
PYTHON="${PYTHON:-python3}"
die() { printf 'sglang-resolve-venv: error: %s\n' "$*" >&2; exit 2; }

version=${1:-}
[[ -n $version ]] || die "usage: $0 VERSION"
lock="$REPO_ROOT/requirements/sglang-$version-resolve.txt"
[[ -f $lock ]] || die "no resolver lock for SGLang $version: $lock"

base=$(bash "$REPO_ROOT/scripts/sglang-venv.sh" "$version" | tail -n1)
donor=""
torch_from=$(sed -n 's/^# torch-from: *//p' "$lock" | head -n1)
[[ -z $torch_from ]] || donor=$(bash "$REPO_ROOT/scripts/sglang-venv.sh" "$torch_from" | tail -n1)

# Keyed by the lock's content and the two parent venvs (which are keyed by their locks).
key=$(printf '%s\n%s\n%s\n' "$(sha256sum < "$lock" | cut -c1-64)" "$base" "$donor" | sha256sum | cut -c1-12)
venv="$ROOT/resolve-$version-$key"
marker="$venv/.ddtree-sglang-venv-complete"
if [[ -f $marker ]]; then printf '%s\n' "$venv"; exit 0; fi

exec 9>"$ROOT/.lock"
flock 9
if [[ ! -f $marker ]]; then
  printf 'sglang-resolve-venv: building %s\n' "$venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [[ -n $donor ]]; then
    dsite=$("$donor/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    farm="$venv/torch-from-$torch_from"
    mkdir -p "$farm"
    for entry in "$dsite"/torch "$dsite"/torch-*.dist-info "$dsite"/torchgen "$dsite"/functorch \
                 "$dsite"/torchvision "$dsite"/torchvision-*.dist-info "$dsite"/torchvision.libs \
                 "$dsite"/triton "$dsite"/triton-*.dist-info "$dsite"/nvidia "$dsite"/nvidia_*.dist-info \
                 "$dsite"/cuda "$dsite"/cuda_*.dist-info; do
      [[ -e $entry ]] && ln -s "$entry" "$farm/"
    done
    printf '%s\n' "$farm" > "$site/a_torch_from.pth"
  fi
  bsite=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "$bsite" > "$site/b_sglang_base.pth"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock" >&2
  "$venv/bin/python" -c 'import transformers, sglang.srt.server_args' \
    || die "SGLang $version resolver venv does not import ($venv)"
  touch "$marker"
  for old in "$ROOT/resolve-$version"-*; do
    [[ $old == "$venv" || ! -d $old ]] || rm -rf "$old"
  done
fi
printf '%s\n' "$venv"
