#!/bin/bash
# What publishing KV events costs the daemon (docs/benchmarks.md, "KV events"):
# kvbench (b) and (c) against a daemon without events and one with events and a
# subscriber reading them (kvctl events), alternating, RUNS times each. Daemon
# and kvbench on CPU 1. Results: $B/res.{off,on}.N.json (kvbench -j).
set -u
cd "$(dirname "$0")/.."
B=${B:-${TMPDIR:-/tmp}/kvbench-events}
mkdir -p "$B"
for i in ${RUNS:-1 2 3}; do
  for mode in off on; do
    S=$B/s.$mode.$i
    EV=""
    [ $mode = on ] && EV="--events-endpoint ipc://$B/ev.$i"
    taskset -c 1 build/daemon/kvcached --config= --socket $S --pool-size 1GiB $EV > $B/log.$mode.$i 2>&1 &
    D=$!
    for t in $(seq 100); do [ -S $S ] && break; sleep 0.05; done
    SUBP=""
    if [ $mode = on ]; then
      build/client/kvctl events --endpoint ipc://$B/ev.$i > /dev/null 2>&1 &
      SUBP=$!
    fi
    taskset -c 1 build/bench/kvbench -c 1 -q --only bc --socket $S -j > $B/res.$mode.$i.json 2>$B/err.$mode.$i
    [ $mode = on ] && build/client/kvctl -s $S-admin.sock metrics | grep kvcached_events_ > $B/metrics.$i
    [ -n "$SUBP" ] && kill $SUBP
    kill $D; wait $D 2>/dev/null
  done
done
