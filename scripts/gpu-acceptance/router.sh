#!/bin/bash
# Device side (after stage.sh 1 and 2): the real router, smg as pinned in ddtree_ops.config.router,
# in front of two real SGLang 0.5.17 servers (no speculation, same model) on the one GPU, with the
# argv the product renders for a router host (render.router.router_argv, defaults except the
# listen address). Records smg's raw answers (/workers, /readiness, /metrics), the router's added
# latency beside direct requests (router_measure.py latency) and a worker's SIGKILL -> taken out ->
# restarted and warm -> registered by the join -> back in (router_measure.py crash), all into
# $OUT/router.tgz.
# Usage: router.sh SMG_WHEEL_DIR
set -uo pipefail
W=${1:?dir with the smg wheel}; H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd)
. "$H/env.sh"; cd "$R"
A=/tmp/acc-router; rm -rf $A; mkdir -p $A
( sleep ${WATCHDOG_S:-560}; tar -C /tmp -czf "${OUT:-/tmp}/router.tgz" acc-router ) & WATCHDOG=$!
step() { local n=$1 to=$2; shift 2; local s=$(date +%s.%N); timeout "$to" "$@" > $A/$n.txt 2>&1; local rc=$?
  printf '%s\t%s\t%s\n' "$n" "$rc" "$(python3 -c "print(round($(date +%s.%N)-$s,2))")" >> $A/steps.tsv; echo "step $n rc=$rc"; }
(cd "$W" && sha256sum -c --quiet SHA256SUMS) || { echo "ROUTER: smg wheel checksum failed"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W"/smg-*.whl || exit 3
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import smg, sglang; print('smg', smg.__version__, 'sglang', sglang.__version__)"
  git -C "$R" rev-parse HEAD 2>/dev/null || echo "no git"; } > $A/versions.txt 2>&1
# what SGLang itself derives when the attention backend and page size are unset (its ServerArgs
# post-init on this GPU), to hold config/derived.py to: plain, EAGLE3 topk 1 / 4, DFLASH
step derived 120 python3 $H/derived_probe.py /tmp/sgl/models
MEM=0.25 bash $H/launch.sh NONE 30001; MEM=0.25 bash $H/launch.sh NONE 30003
step ready_30001 200 bash $H/wait.sh 30001 190; step ready_30003 200 bash $H/wait.sh 30003 190
python3 -c "
from ddtree_ops.config.router import Router, RouterSettings
from ddtree_ops.render.router import router_argv
r = Router('gpu', None, RouterSettings(host='127.0.0.1'), ('http://127.0.0.1:30001', 'http://127.0.0.1:30003'), False, None)
print('\n'.join(router_argv(r)))" > $A/argv.txt
mapfile -t ARGV < $A/argv.txt
setsid python3 -m smg launch "${ARGV[@]}" > $A/smg.log 2>&1 < /dev/null & SMG=$!
t0=$(date +%s)
until curl -sf --max-time 3 http://127.0.0.1:30081/readiness 2>/dev/null | grep -q '"healthy_workers":2'; do
  kill -0 $SMG 2>/dev/null || { echo "smg died"; break; }; [ $(( $(date +%s) - t0 )) -gt 90 ] && { echo "smg not ready in 90 s"; break; }; sleep 1; done
echo "router ready after $(( $(date +%s) - t0 )) s" | tee $A/router_ready.txt
for p in /workers /readiness /health; do curl -s --max-time 5 -w '\nHTTP %{http_code}\n' http://127.0.0.1:30081$p > $A/health_port$(echo $p | tr / _).txt; done
curl -s --max-time 5 http://127.0.0.1:30080/workers > $A/workers.json
curl -s --max-time 5 http://127.0.0.1:29000/metrics > $A/metrics_idle.txt
step latency 240 python3 $H/router_measure.py latency http://127.0.0.1:30080 http://127.0.0.1:30001,http://127.0.0.1:30003 1,16,64 3 $A/latency.json
curl -s --max-time 5 http://127.0.0.1:29000/metrics > $A/metrics_after_latency.txt
# The crash as a deployed worker host lives it: the join unit's stop (BindsTo= the SGLang unit)
# runs `router_worker leave` right after the kill (LEAVE=0 leaves that out, to record what smg's own
# health checks do); the restart ends once the worker is warm (the unit's ExecStartPost warmup), and
# only then does the join unit register it (router_worker join, with a config of join_config's
# shape). The router must not list the worker healthy again before that join.
python3 -c "
import json, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, json.dumps({'worker': 'http://127.0.0.1:30003', 'hold': '/tmp/acc-router/hold',
                         'routers': [{'name': 'gpu', 'api': 'http://127.0.0.1:30080', 'key': None, 'deadline_s': 60}]}).encode())
" $A/join.json
step crash 300 python3 $H/router_measure.py crash http://127.0.0.1:30080 http://127.0.0.1:30003 \
  "kill -KILL -- -\$(cat /tmp/sgl/server-30003.pid); sleep 1; ! curl -sf --max-time 2 -o /dev/null http://127.0.0.1:30003/health$([ "${LEAVE:-1}" = 1 ] && echo "; python3 -m ddtree_ops.fleet.router_worker leave --config $A/join.json --deadline 15 > $A/crash_leave.json")" \
  "MEM=0.25 bash $H/launch.sh NONE 30003 && bash $H/wait.sh 30003 200 && python3 -m ddtree_ops warmup http://127.0.0.1:30003 --batch-sizes 1,2,4,8 --deadline 120 --json > $A/crash_warmup.json" \
  $A/crash.json "python3 -m ddtree_ops.fleet.router_worker join --config $A/join.json"
curl -s --max-time 5 http://127.0.0.1:30080/workers > $A/workers_after_crash.json
curl -s --max-time 5 http://127.0.0.1:29000/metrics > $A/metrics_after_crash.txt
kill -TERM $SMG 2>/dev/null; for p in 30001 30003; do bash $H/stop.sh $p > /dev/null 2>&1; done
gzip -9 -n -c $A/smg.log > $A/smg.log.gz && rm -f $A/smg.log
kill $WATCHDOG 2>/dev/null
tar -C /tmp -czf "${OUT:-/tmp}/router.tgz" acc-router && ls -la "${OUT:-/tmp}/router.tgz"
