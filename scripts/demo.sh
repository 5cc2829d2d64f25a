#!/usr/bin/env bash
# The main job on a local test host: set up, boot a real systemd test host, show the plan
# for the shipped b300 inventory, deploy with `ansible-playbook deploy.yml`, then show the
# service active under systemd, health, warmup over the plan and acceptance length.
# The test host stays up afterwards; stop it with: scripts/testhost.sh down
#
#   scripts/demo.sh                  the simulator as the host's SGLang server
#   scripts/demo.sh --real-sglang    also install the real SGLang 0.5.23 release beside it (as the
#                                    tests do: ~540 MiB wheelhouse, ~1 min more) and check the
#                                    rendered argv with its own parser
set -euo pipefail
cd "$(dirname "$0")/.."
real_sglang=0
usage() { printf 'usage: %s [--real-sglang]\n' "$0"; }
case "$#:${1-}" in
  0:) ;;
  1:--real-sglang) real_sglang=1 ;;
  1:-h | 1:--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
source scripts/lib/phase.sh
phase "set up (apt packages, .venv, test-host rootfs)"
bash scripts/setup.sh
# The SGLang wheelhouse is content-keyed: share it across checkouts (as test.sh does).
export DDTREE_SGLANG_WHEELHOUSE=${DDTREE_SGLANG_WHEELHOUSE:-/var/cache/ddtree-ops/sglang-wheelhouse}
phase "boot the test host"
bash scripts/testhost.sh up
phase "test-host stand-ins (NVIDIA apt repository, nvidia-smi)"
bash scripts/testhost-standins.sh up   # NVIDIA apt repo + nvidia-smi stand-ins (no GPU here)
export PATH="$PWD/.venv/bin:$PATH"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; phase "$*"; }

step "Plan for the shipped b300 inventory (inventory/example)"
ddtree-ops plan -i inventory/example -l b300

step "Plan for the test host (inventory/test: b300 profile, SGLang simulator)"
ddtree-ops plan -i inventory/test

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
extra=()
if ((real_sglang == 0)); then
  # inventory/test installs the real release beside the simulator (the tests need it); the demo
  # deploys the same ddtree_sglang without it (install_release off, no lock) unless asked.
  python -c 'import json, sys, yaml
pin = yaml.safe_load(open(sys.argv[1]))["ddtree_sglang"]
pin["install_release"] = False
pin.pop("requirements", None)  # the lock of that release: the validator refuses it without one
json.dump({"ddtree_sglang": pin}, sys.stdout)' inventory/test/group_vars/testhosts.yml >"$tmp/demo-vars.json"
  extra=(-e "@$tmp/demo-vars.json")
fi
step "ansible-playbook deploy.yml -i inventory/test ${extra[*]}"
start=$(date +%s)
ansible-playbook -i inventory/test deploy.yml "${extra[@]}"
echo "deploy took $(( $(date +%s) - start )) s"

addr=$(bash scripts/testhost.sh status | awk '$1=="ddt-th1" {print $3}')
step "systemd on the test host"
bash scripts/testhost.sh ssh ddt-th1 systemctl --no-pager status ddtree-sglang.service | head -n 12
printf 'is-active: '; bash scripts/testhost.sh ssh ddt-th1 systemctl is-active ddtree-sglang.service

step "The unit became active only after its own warmup (ExecStartPost) covered the plan"
bash scripts/testhost.sh ssh ddt-th1 "journalctl -u ddtree-sglang.service -b --no-pager -o cat | grep -E 'batch sizes|warmup:' | tail -n 2"

step "Warmup over every captured batch size of the plan (from the controller)"
plan=$tmp/plan.json
bash scripts/testhost.sh ssh ddt-th1 cat /etc/ddtree-ops/sglang/plan.json >"$plan"
ddtree-ops warmup "http://$addr:30000" --plan "$plan" --deadline 120

step "Health: liveness, readiness, drift from the deployed plan, progress, acceptance length"
ddtree-ops health "http://$addr:30000" --plan "$plan"

step "Exporter scraped by Prometheus on the monitoring host (ddt-th1)"
printf 'exporter is-active: '; bash scripts/testhost.sh ssh ddt-th1 systemctl is-active ddtree-sglang-exporter.service
q='http://127.0.0.1:9090/api/v1/query?query=ddtree_accept_length'
for _ in $(seq 30); do
  res=$(bash scripts/testhost.sh ssh ddt-th1 curl -fsS --max-time 5 "'$q'" || true)
  case "$res" in *'"value"'*) break ;; esac
  sleep 1
done
echo "Prometheus: $res"
echo
echo "The test host stays up: scripts/testhost.sh ssh ddt-th1 | scripts/testhost.sh down"
phase "demo done"
