#!/usr/bin/env bash
# Cached virtual environments holding real, released SGLang packages, importable on a
# machine without GPUs: enough to import `sglang.srt.server_args`, run SGLang's own
# argument parser (`prepare_server_args`) and, for 0.5.23, its resolver. Used by the
# peer test tier and by the capability-probe tests; never by a production host.
#
#   scripts/sglang-venv.sh VERSION      build (once) and print the venv's directory
#   scripts/sglang-venv.sh --list       versions that have a lock file
#
# Each version has a lock, requirements/sglang-VERSION-import.txt: the exact packages
# SGLang's import chain needs (numpy, torch, triton, ...), not SGLang's full dependency
# set (GPU kernels, several GB). SGLang itself is installed with --no-deps on top.
# Torch: 0.5.23 imports with the CPU build 2.13.0 on local disk; 0.5.13.post1 imports
# torchvision at module level, whose compiled ops need a CUDA build of torch, so its lock
# takes torch 2.14.1 + torchvision 0.29.1 (also on local disk on these machines).
#
# Environment:
#   DDTREE_SGLANG_VENV_ROOT   where venvs live (default /var/cache/ddtree-ops/sglang-venv)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="${DDTREE_SGLANG_VENV_ROOT:-/var/cache/ddtree-ops/sglang-venv}"
PYTHON="${PYTHON:-python3}"

die() { printf 'sglang-venv: error: %s\n' "$*" >&2; exit 2; }
log() { printf 'sglang-venv: %s\n' "$*" >&2; }

if [[ ${1:-} == --list ]]; then
  for f in "$REPO_ROOT"/requirements/sglang-*-import.txt; do
    f=${f##*/sglang-}; printf '%s\n' "${f%-import.txt}"
  done
  exit 0
fi

version=${1:-}
[[ -n $version ]] || die "usage: $0 VERSION | --list"
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] || die "not a release version: '$version'"
lock="$REPO_ROOT/requirements/sglang-$version-import.txt"
[[ -f $lock ]] || die "no lock for SGLang $version: $lock (see --list)"

# The venv is keyed by version and lock content: editing the lock builds a new one.
key=$(sha256sum "$lock" | cut -c1-12)
venv="$ROOT/$version-$key"
marker="$venv/.ddtree-sglang-venv-complete"
if [[ -f $marker ]]; then
  printf '%s\n' "$venv"
  exit 0
fi

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock 9                          # one builder at a time; others wait, then reuse
if [[ ! -f $marker ]]; then
  log "building $venv (SGLang $version; a few minutes the first time)"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install -r "$lock" >&2
  "${pip[@]}" install --no-deps "sglang==$version" >&2
  "$venv/bin/python" -c 'import sglang.srt.server_args' 2>/dev/null \
    || die "SGLang $version does not import in $venv (lock incomplete?)"
  touch "$marker"
  # Older builds of the same version (previous lock contents) are dropped.
  for old in "$ROOT/$version"-*; do
    [[ $old == "$venv" || ! -d $old ]] || rm -rf "$old"
  done
fi
printf '%s\n' "$venv"
