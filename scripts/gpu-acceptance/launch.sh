#!/bin/bash
# Start real SGLang detached (survives the device call). Usage: launch.sh EAGLE3|DFLASH|NONE PORT
# Env: SIM_ACC forces the accept length (SGLANG_SIMULATE_ACC_LEN); MEM the memory fraction (0.25);
# WAIT the readiness deadline in seconds (300). The flags are those the 2026-12-01 captures ran
# (tests/fixtures/gpu/sglang-0.5.17-h200-2026-12-01/README.md).
ALGO=${1:?algo}; PORT=${2:?port}; M=/tmp/sgl/models
. "$(dirname "$0")/env.sh"
case $ALGO in
  EAGLE3) SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $M/tiny-eagle3 --speculative-draft-load-format dummy --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4";;
  DFLASH) SPEC="--speculative-algorithm DFLASH --speculative-draft-model-path $M/tiny-dflash --speculative-draft-load-format dummy";;
  NONE)   SPEC="";;
  *) echo "unknown algo $ALGO"; exit 1;;
esac
LOG=/tmp/sgl/server-$ALGO-$PORT.log
( [ -n "${SIM_ACC:-}" ] && export SGLANG_SIMULATE_ACC_LEN=$SIM_ACC
  exec setsid python3 -m sglang.launch_server --model-path $M/tiny-llama --load-format dummy $SPEC \
    --attention-backend triton --sampling-backend pytorch --enable-metrics --decode-log-interval 1 \
    --served-model-name tiny-llama --dtype bfloat16 --context-length 2048 --max-running-requests 16 \
    --max-total-tokens 262144 --mem-fraction-static ${MEM:-0.25} --cuda-graph-max-bs-decode 8 \
    --mm-feature-transport cpu --host 127.0.0.1 --port $PORT ) > $LOG 2>&1 < /dev/null &
echo $! > /tmp/sgl/server-$PORT.pid
echo "started $ALGO on $PORT (pid $(cat /tmp/sgl/server-$PORT.pid), log $LOG)"
