#!/bin/bash
# Device side (after stage.sh 1 and 2): what real SGLang 0.5.17 does with the multi-node flags on
# the one GPU of the lent machine, recorded for the simulator's multi-node behaviour.
#   A: rank 0 of --nnodes 2 alone (its rendezvous port open, nobody joins)
#   B: rank 1 of --nnodes 2 alone (it dials a rendezvous address nobody serves)
#   C: both ranks of one --nnodes 2 --tp 2 deployment, then rank 1 killed: on the same GPU, or with
#      PAIR_GPU=1 on a machine of two GPUs (nvidia-h200-x2) rank 0 on GPU 0 and rank 1 on GPU 1, a
#      serving pair (one GPU cannot hold one: NCCL "invalid usage", recorded 2026-12-02)
# Each is bounded by --dist-timeout and a poll deadline. Every POLL_S seconds the poller writes
# one line per process: elapsed seconds, alive, HTTP code of /health (000: nothing listens), and
# whether the rendezvous port accepts a TCP connection. Everything goes into $OUT/multinode.tgz.
set -uo pipefail
H=$(cd "$(dirname "$0")" && pwd); M=/tmp/sgl/models
. "$H/env.sh"
A=/tmp/acc-multinode; rm -rf $A; mkdir -p $A
( sleep ${WATCHDOG_S:-540}; tar -C /tmp -czf "${OUT:-/tmp}/multinode.tgz" acc-multinode ) & WATCHDOG=$!
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"; } > $A/versions.txt 2>&1
DT=${DIST_TIMEOUT:-60}
start() {  # NAME HTTP_PORT NODE_RANK RDV_PORT [extra...]
  local n=$1 port=$2 rank=$3 rdv=$4 gpu=0; shift 4
  [ -n "${PAIR_GPU:-}" ] && [ "$rank" = 1 ] && gpu=$PAIR_GPU
  echo "python3 -m sglang.launch_server --model-path $M/tiny-llama --load-format dummy --attention-backend triton --sampling-backend pytorch --enable-metrics --served-model-name tiny-llama --dtype bfloat16 --context-length 2048 --max-running-requests 8 --max-total-tokens 65536 --mem-fraction-static 0.2 --cuda-graph-max-bs-decode 4 --mm-feature-transport cpu --host 127.0.0.1 --port $port --tp-size 2 --nnodes 2 --node-rank $rank --dist-init-addr 127.0.0.1:$rdv --dist-timeout $DT $*" > $A/$n.argv
  ( CUDA_VISIBLE_DEVICES=$gpu exec setsid bash -c "$(cat $A/$n.argv)" ) > $A/$n.log 2>&1 < /dev/null &
  echo $! > $A/$n.pid
}
poll() {  # SECONDS NAME:HTTP_PORT:RDV_PORT ...  (stops early when every process has exited)
  local until=$1; shift; local t0=$(date +%s.%N)
  while :; do
    local t=$(python3 -c "print(round($(date +%s.%N)-$t0,1))") any=0
    for spec in "$@"; do IFS=: read -r n port rdv <<< "$spec"; local pid=$(cat $A/$n.pid) alive=0
      kill -0 $pid 2>/dev/null && { alive=1; any=1; }
      local code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:$port/health)
      local rdv_open=0; timeout 1 bash -c "echo > /dev/tcp/127.0.0.1/$rdv" 2>/dev/null && rdv_open=1
      printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$n" "$alive" "$code" "$rdv_open" >> $A/poll.tsv
    done
    [ $any = 0 ] && break
    python3 -c "import sys; sys.exit(0 if $(date +%s.%N)-$t0 < $until else 1)" || break
    sleep ${POLL_S:-3}
  done
}
finish() { for n in "$@"; do local pid=$(cat $A/$n.pid); kill -0 $pid 2>/dev/null && { echo "$n alive at the deadline: killed"; kill -9 -- -$pid $pid 2>/dev/null; } || {
  wait $pid 2>/dev/null; echo "$n exited"; }; done; sleep 3; }
printf 't_s\tname\talive\thealth_http\trendezvous_open\n' > $A/poll.tsv
# A and B at once: different rendezvous ports, so they never meet
start A_rank0_alone 30011 0 29611; start B_rank1_alone 30012 1 29612
poll $(( DT + 60 )) A_rank0_alone:30011:29611 B_rank1_alone:30012:29612
finish A_rank0_alone B_rank1_alone > $A/AB_end.txt 2>&1
# C: both ranks, one GPU, then rank 1 killed once rank 0 answers /health (or the deadline)
start C_rank0 30021 0 29621; start C_rank1 30022 1 29621
poll 200 C_rank0:30021:29621 C_rank1:30022:29621 &
POLLER=$!; t0=$(date +%s)
until curl -sf -o /dev/null --max-time 2 http://127.0.0.1:30021/health; do
  kill -0 $(cat $A/C_rank0.pid) 2>/dev/null || break; [ $(( $(date +%s) - t0 )) -gt 170 ] && break; sleep 2; done
echo "C: rank 0 /health 200 after $(( $(date +%s) - t0 )) s (or gave up)" > $A/C_events.txt
curl -s --max-time 20 -H 'Content-Type: application/json' -d '{"text":"Hello","sampling_params":{"max_new_tokens":8}}' \
  -w '\nHTTP %{http_code}\n' http://127.0.0.1:30021/generate > $A/C_generate_both.txt 2>&1
# what rank 1's health-only server answers while the pair serves (the exporter of rank 0 could probe it)
for path in health ping metrics; do curl -s --max-time 5 -w '\nHTTP %{http_code}\n' http://127.0.0.1:30022/$path \
  | tail -c 4000 > $A/C_rank1_$path.txt 2>&1; done
echo "C: killing rank 1 at $(( $(date +%s) - t0 )) s" >> $A/C_events.txt
kill -9 -- -$(cat $A/C_rank1.pid) 2>/dev/null; kill -9 $(cat $A/C_rank1.pid) 2>/dev/null
sleep 5
curl -s --max-time 30 -H 'Content-Type: application/json' -d '{"text":"Hello","sampling_params":{"max_new_tokens":8}}' \
  -w '\nHTTP %{http_code}\n' http://127.0.0.1:30021/generate > $A/C_generate_after_kill.txt 2>&1
curl -s --max-time 30 -w '\nHTTP %{http_code}\n' http://127.0.0.1:30021/health > $A/C_health_after_kill.txt 2>&1
wait $POLLER
finish C_rank0 C_rank1 > $A/C_end.txt 2>&1
pkill -9 -f sglang.launch_server 2>/dev/null; sleep 2
kill $WATCHDOG 2>/dev/null; tar -C /tmp -czf "${OUT:-/tmp}/multinode.tgz" acc-multinode; echo "multinode.tgz written"
tail -5 $A/poll.tsv; cat $A/C_events.txt
