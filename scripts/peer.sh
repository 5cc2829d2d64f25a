#!/usr/bin/env bash
# The peer test tier: our rendered argv, our plan, our SGLang plugin and our simulator
# checked against REAL released SGLang (tests/peer). Builds (once; cached under
# /var/cache/ddtree-ops/sglang-venv, keyed by lock content) or reuses:
#   scripts/sglang-venv.sh 0.5.13.post1      import venv (CUDA torch 2.14.1 build, ~6 GB)
#   scripts/sglang-venv.sh 0.5.23            import venv (CPU torch 2.13.0)
#   scripts/sglang-resolve-venv.sh 0.5.23    child venv for 0.5.23's resolver (~200 MB)
# then runs pytest on tests/peer with DDTREE_PEER=1 (a missing venv fails the tier).
#
#   scripts/peer.sh [PYTEST_ARGS...]    build/reuse the venvs, run the tier
#   scripts/peer.sh --venvs             only build/reuse the venvs
set -euo pipefail
cd "$(dirname "$0")/.."

PEER_VERSIONS=(0.5.13.post1 0.5.23)
RESOLVE_VERSIONS=(0.5.23)

venvs() {
  local v
  for v in "${PEER_VERSIONS[@]}"; do bash scripts/sglang-venv.sh "$v" >/dev/null; done
  for v in "${RESOLVE_VERSIONS[@]}"; do bash scripts/sglang-resolve-venv.sh "$v" >/dev/null; done
}

if [[ ${1:-} == --venvs ]]; then
  venvs
  exit 0
fi
[[ -x .venv/bin/python ]] || bash scripts/setup.sh
venvs
DDTREE_PEER=1 exec .venv/bin/python -m pytest -p no:cacheprovider -ra tests/peer "$@"
