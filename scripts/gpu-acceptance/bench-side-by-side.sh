#!/bin/bash
# Device side (after stage.sh 1 and 2): ddtree-ops bench beside SGLang's own sglang.bench_serving on one
# real DFLASH server (acceptance forced to 3.0), same concurrency levels, requests, input and output
# lengths, each client's CPU time measured; packed into $OUT/bench-side-by-side.tgz.
set -uo pipefail
H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd); . "$H/env.sh"; cd "$R"
A=/tmp/acc; rm -rf $A; mkdir -p $A; export COLUMNS=160 NO_COLOR=1
date -u +%FT%TZ > $A/versions.txt
SIM_ACC=3.0 bash $H/launch.sh DFLASH 30002; bash $H/wait.sh 30002 320 | tee $A/ready.txt
U=http://127.0.0.1:30002
cpu() { local n=$1; shift; local TIMEFORMAT="$n wall_s=%R user_s=%U sys_s=%S"; { time "$@" ; } 2>> $A/cpu.txt; }
for round in 1 2; do
  for c in 1 4 16; do
    cpu bench_serving_c${c}_r$round timeout 120 python3 -m sglang.bench_serving --backend sglang --base-url $U \
      --dataset-name random-ids --random-input-len 64 --random-output-len 64 --random-range-ratio 1 --num-prompts 96 \
      --max-concurrency $c --tokenizer /tmp/sgl/models/tiny-llama --output-file $A/bench_serving.jsonl --disable-tqdm \
      > $A/bench_serving_c${c}_r$round.txt
  done
  cpu ours_r$round timeout 200 python3 -m ddtree_ops bench $U --concurrency 1,4,16 --requests 96 --max-new-tokens 64 \
    --warmup 2 --out $A/ours_r$round > $A/ours_r$round.txt
done
bash $H/stop.sh 30002 >/dev/null 2>&1; cp /tmp/sgl/server-DFLASH-30002.log $A/
tar -C /tmp -czf "${OUT:-/tmp}/bench-side-by-side.tgz" acc && ls -la "${OUT:-/tmp}/bench-side-by-side.tgz"
