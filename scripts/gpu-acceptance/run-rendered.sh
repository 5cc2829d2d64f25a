#!/bin/bash
# Device side (after stage.sh 1 and 2): the deployment the PRODUCT rendered, on real SGLang.
# Usage: run-rendered.sh RENDER_DIR HOST    (RENDER_DIR from `ddtree-ops render -i inventory/h200 --out RENDER_DIR`)
# It launches the unit's ExecStart argv exactly as rendered, from `-m sglang.launch_server` on, with the
# unit's EnvironmentFile, and then runs the unit's own ExecStartPost steps (health --wait, warmup with
# the marker) and the tools a deployed host runs with the plan: health --plan (drift against the real
# /server_info), exporter --plan, release gate, probe-sglang (the real build and GPU), preflight with
# the plan's host class, diagnose on the log. What differs from systemd (said in differences.txt): no
# unit, user or sandbox; the interpreter is the device's python3 with SGLang in /tmp/site instead of
# the sglang role's venv; directories of the env file are created here; a ptxas path the machine
# lacks is replaced by its own.
set -uo pipefail
RD=${1:?render dir}; HOSTN=${2:?host}; H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd)
. "$H/env.sh"; cd "$R"; export COLUMNS=160 NO_COLOR=1
A=/tmp/acc; rm -rf $A; mkdir -p $A; O="python3 -m ddtree_ops"
UNIT=$(ls $RD/$HOSTN/etc/systemd/system/ddtree-*.service | grep -v -e exporter -e nvidia | head -1)
ETC=$(ls -d $RD/$HOSTN/etc/ddtree-ops/*/ | head -1); PLAN=$ETC/plan.json; ENVF=$ETC/sglang.env
( sleep ${WATCHDOG_S:-560}; tar -C /tmp -czf "${OUT:-/tmp}/rendered.tgz" acc ) & WATCHDOG=$!
step() { local n=$1 to=$2; shift 2; local s=$(date +%s.%N); timeout "$to" "$@" > $A/$n.txt 2>&1; local rc=$?
  printf '%s\t%s\t%s\n' "$n" "$rc" "$(python3 -c "print(round($(date +%s.%N)-$s,2))")" >> $A/steps.tsv; echo "step $n rc=$rc"; }
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import sglang; print('sglang', sglang.__version__)"; } > $A/versions.txt 2>&1
cp "$UNIT" "$PLAN" "$ENVF" $A/
: > $A/differences.txt
set -a; while IFS= read -r line; do
  case "$line" in ''|'#'*) continue;; esac
  k=${line%%=*}; v=${line#*=}
  case $k in *_DIR|HOME|XDG_CACHE_HOME|HF_HOME|FLASHINFER_WORKSPACE_BASE) mkdir -p "$v";; esac
  if [[ $k == TRITON_PTXAS*_PATH && ! -x $v ]]; then
    alt=$(command -v ptxas || echo "$CUDA_HOME/bin/ptxas"); echo "$k=$v is not on this machine: $alt instead" >> $A/differences.txt; v=$alt
  fi
  export "$k=$v"
done < "$ENVF"; set +a
argv=$(grep '^ExecStart=' "$UNIT" | head -1 | sed 's/^ExecStart=//')
interp=${argv%% -m sglang.launch_server*}; echo "interpreter $interp -> python3 (SGLang 0.5.17 in /tmp/site)" >> $A/differences.txt
echo "${argv#"$interp" }" > $A/argv.txt
cd /tmp && setsid python3 ${argv#"$interp" } > /tmp/sgl/server-rendered.log 2>&1 < /dev/null & echo $! > /tmp/sgl/server-30000.pid; cd "$R"
URL=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['url'])" "$PLAN")
# the unit's RuntimeDirectory= (systemd makes it under /run): the warm marker lives there
for d in $(grep '^RuntimeDirectory=' "$UNIT" | sed 's/^RuntimeDirectory=//'); do mkdir -p "/run/$d"; done
# the unit's own readiness: ExecStartPost lines, interpreter replaced
while IFS= read -r post; do
  n=$((${n:-0}+1)); cmd=${post#ExecStartPost=}; cmd=${cmd#* -m ddtree_ops }
  cmd=$(echo "$cmd" | sed "s|/etc/ddtree-ops/[^ ]*/plan.json|$PLAN|g")
  step unit_post_$n 660 $O $cmd
done < <(grep '^ExecStartPost=' "$UNIT")
curl -s --max-time 10 $URL/server_info > $A/server_info.json
cp /run/ddtree-ops/*/warm.json $A/ 2>/dev/null
step health_plan 120 $O health --plan $PLAN --json
timeout 200 $O exporter --plan $PLAN --listen 127.0.0.1:19400 --poll-interval 1 --window 30 > $A/exporter.log 2>&1 & EP=$!
sleep 3; curl -s --max-time 5 http://127.0.0.1:19400/metrics > $A/exporter_idle.txt
step release_gate 150 $O release gate --plan $PLAN --json
sleep 4  # a few polls after the load, so the window holds the finished requests
curl -s --max-time 5 http://127.0.0.1:19400/metrics > $A/exporter_after_gate.txt
kill $EP 2>/dev/null
step probe_sglang 300 $O probe-sglang --plan $PLAN --python python3 --json
step preflight_plan 120 $O preflight --plan $PLAN --json
step diagnose 60 $O diagnose --file /tmp/sgl/server-rendered.log --plan $PLAN --json
bash $H/stop.sh 30000 > /dev/null 2>&1; gzip -9 -n -c /tmp/sgl/server-rendered.log > $A/server-rendered.log.gz
kill $WATCHDOG 2>/dev/null
tar -C /tmp -czf "${OUT:-/tmp}/rendered.tgz" acc && ls -la "${OUT:-/tmp}/rendered.tgz"
