#!/bin/bash
# Wait (bounded) until the server on PORT answers /health 200. Usage: wait.sh PORT [SECONDS]
PORT=${1:?port}; WAIT=${2:-300}; t0=$(date +%s); P=$(cat /tmp/sgl/server-$PORT.pid)
until curl -sf -o /dev/null --max-time 5 http://127.0.0.1:$PORT/health; do
  kill -0 $P 2>/dev/null || { echo "port $PORT: SERVER DIED"; exit 5; }
  [ $(( $(date +%s) - t0 )) -gt $WAIT ] && { echo "port $PORT: not ready after ${WAIT}s"; exit 6; }
  sleep 2
done
echo "port $PORT ready after $(( $(date +%s) - t0 )) s"
