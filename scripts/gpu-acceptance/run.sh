#!/bin/bash
# Device side of the GPU acceptance run (after stage.sh 1 and 2): real SGLang 0.5.17 on the lent GPU,
# and ddtree-ops' runtime tools against it. Everything lands in /tmp/acc, packed into
# $OUT/acceptance.tgz (the one file that comes back); scripts/gpu-acceptance.sh collect unpacks it
# into tests/fixtures/gpu/. Each step is bounded (timeout) and its exit code recorded in steps.tsv;
# a failing step does not stop the run.
#
# Servers (one GPU, memory fraction 0.25 each): EAGLE3 with random draft weights on 30000 (real
# acceptance, ~1.0), DFLASH with acceptance forced to 3.0 (SGLANG_SIMULATE_ACC_LEN) on 30002, and the
# same model without speculation on 30001 (the baseline).
set -uo pipefail
H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd)
. "$H/env.sh"
A=/tmp/acc; rm -rf $A; mkdir -p $A; cd "$R"
O="python3 -m ddtree_ops"; export COLUMNS=160 NO_COLOR=1
T0=$(date +%s)
# The device call ends at 600 s and then nothing comes back: pack what there is at 560 s whatever runs.
( sleep 560; tar -C /tmp -czf "${OUT:-/tmp}/acceptance.tgz" acc ) & WATCHDOG=$!
step() {  # step NAME TIMEOUT CMD...: run, keep its output in NAME.txt, record rc and seconds
  local n=$1 to=$2; shift 2; local s=$(date +%s.%N)
  timeout "$to" "$@" > $A/$n.txt 2>&1; local rc=$?
  printf '%s\t%s\t%s\n' "$n" "$rc" "$(python3 -c "print(round($(date +%s.%N)-$s,2))")" >> $A/steps.tsv
  echo "step $n rc=$rc"
}
{ date -u +%FT%TZ; nvidia-smi -L
  python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
  git -C "$R" rev-parse HEAD 2>/dev/null || echo "no git"; } > $A/versions.txt 2>&1
step plugin_describe 120 python3 -c "import json; from ddtree_ops.sglang import plugin; print(json.dumps(plugin.describe(), indent=1))"

# --- servers
SIM_ACC=3.0 bash $H/launch.sh DFLASH 30002; sleep 3
bash $H/launch.sh EAGLE3 30000; sleep 3
bash $H/launch.sh NONE 30001
for p in 30000 30001 30002; do step ready_$p 330 bash $H/wait.sh $p 320; done
echo "servers up after $(( $(date +%s) - T0 )) s"

# --- raw answers (the simulator is held to these)
for x in eagle3:30000 none:30001 dflash:30002; do step capture_${x%%:*} 90 bash $H/capture.sh ${x##*:} $A/${x%%:*}; done

# --- the product's runtime tools, no plan: everything read from the servers
for x in eagle3:30000 none:30001 dflash:30002; do
  n=${x%%:*}; U=http://127.0.0.1:${x##*:}
  step health_$n 120 $O health $U --json
  step warmup_$n 300 $O warmup $U --json
done
# exporters on the speculative servers and the baseline, scraped idle, under bench load, after
for x in eagle3:30000:19400 dflash:30002:19402 none:30001:19401; do
  IFS=: read n p e <<< "$x"
  timeout 400 $O exporter --upstream http://127.0.0.1:$p --listen 127.0.0.1:$e --poll-interval 1 --window 30 > $A/exporter_$n.log 2>&1 &
done
sleep 4
for e in 19400 19401 19402; do curl -s --max-time 5 http://127.0.0.1:$e/metrics > $A/exporter_${e}_idle.txt; done
( for i in $(seq 1 40); do sleep 2; for e in 19400 19401 19402; do curl -s --max-time 5 http://127.0.0.1:$e/metrics > $A/exporter_${e}_load_$i.txt; done; done ) &
SCRAPER=$!
step bench_dflash 240 $O bench http://127.0.0.1:30002 --concurrency 1,4,16 --requests 48 --max-new-tokens 64 --out $A/bench_dflash --baseline http://127.0.0.1:30001
step bench_eagle3 180 $O bench http://127.0.0.1:30000 --concurrency 1,4,16 --requests 48 --max-new-tokens 64 --out $A/bench_eagle3
kill $SCRAPER 2>/dev/null; wait $SCRAPER 2>/dev/null
for e in 19400 19401 19402; do curl -s --max-time 5 http://127.0.0.1:$e/metrics > $A/exporter_${e}_after.txt; done
step bench_compare 60 $O bench-compare $A/bench_dflash/spec $A/bench_dflash/baseline --out $A/bench_compare
# SGLang's own client at the same concurrency and output length, beside ours
for c in 1 4 16; do
  step bench_serving_dflash_c$c 120 python3 -m sglang.bench_serving --backend sglang --base-url http://127.0.0.1:30002 \
    --dataset-name random-ids --random-input-len 64 --random-output-len 64 --random-range-ratio 1 --num-prompts 48 \
    --max-concurrency $c --tokenizer /tmp/sgl/models/tiny-llama --output-file $A/bench_serving_dflash.jsonl --disable-tqdm
done
step bench_ours_same_shape 200 $O bench http://127.0.0.1:30002 --concurrency 1,4,16 --requests 48 --max-new-tokens 64 --warmup 0 --out $A/bench_ours_same_shape
pkill -f "ddtree_ops exporter" 2>/dev/null
# --- the machine and the logs
step preflight 120 $O preflight --json
step diagnose_eagle3 60 $O diagnose --file /tmp/sgl/server-EAGLE3-30000.log --json
step diagnose_dflash 60 $O diagnose --file /tmp/sgl/server-DFLASH-30002.log --json
nvidia-smi > $A/nvidia-smi.txt 2>&1
for p in 30000 30001 30002; do bash $H/stop.sh $p > /dev/null 2>&1; done
cp /tmp/sgl/server-*.log $A/ 2>/dev/null
kill $WATCHDOG 2>/dev/null
echo "run done after $(( $(date +%s) - T0 )) s" | tee -a $A/steps.tsv
tar -C /tmp -czf "${OUT:-/tmp}/acceptance.tgz" acc && ls -la "${OUT:-/tmp}/acceptance.tgz"
