#!/usr/bin/env bash
# The test command: set up, boot the systemd test host, run every test (pytest), and
# stop the test host again. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
trap 'bash scripts/testhost.sh down >/dev/null 2>&1 || true' EXIT
bash scripts/testhost.sh up
DDTREE_TESTHOSTS=1 .venv/bin/python -m pytest -p no:cacheprovider -rs "$@"
