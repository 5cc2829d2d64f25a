#!/usr/bin/env bash
# The linters (the lint phase of scripts/test.sh, before pytest; `make lint`): ruff over the
# Python (pyproject.toml [tool.ruff]), yamllint over the Ansible YAML (.yamllint) and
# ansible-lint's production profile, offline (.ansible-lint). All three run, then the script
# exits 1 naming the ones that failed. They come from the project venv (the `lint` extra,
# pinned in constraints.txt, installed by scripts/setup.sh); this script downloads nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phase.sh
VENV=${VENV:-.venv}
for tool in ruff yamllint ansible-lint; do
  if [ ! -x "$VENV/bin/$tool" ]; then
    echo "lint: $VENV/bin/$tool is missing; run scripts/setup.sh (it installs the lint extra)" >&2
    exit 2
  fi
done
# ansible-lint runs ansible-playbook --syntax-check: the venv's, with this checkout's ansible.cfg.
export PATH="$PWD/$VENV/bin:$PATH"
failed=()
phase "lint: ruff"
"$VENV/bin/ruff" check --no-cache . || failed+=(ruff)
phase "lint: yamllint"
"$VENV/bin/yamllint" --strict roles playbooks deploy.yml inventory .yamllint .ansible-lint || failed+=(yamllint)
phase "lint: ansible-lint (production profile, offline)"
"$VENV/bin/ansible-lint" --nocolor -q || failed+=(ansible-lint)
if [ ${#failed[@]} -gt 0 ]; then
  echo "lint: failed: ${failed[*]} (see above; fix the findings, the configuration says why each rule is set)" >&2
  exit 1
fi
phase "lint: ok"
