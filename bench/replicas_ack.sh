#!/bin/sh
# What `[backend] replicas_ack = 1` costs: a master and one replica (CPU 0), `slidegate bench`
# (CPU 1) on 10,000 keys (admissions, each followed by a WAIT) and on one hot key (denials after
# the first 100: no WAIT), 64 in flight, 5 s per run, without and with `--redis-replicas-ack 1`,
# alternated over ROUNDS rounds (default 3). Prints decisions/s, p50/p99 and the WAITs sent per
# admission (admissions answered together share one) for each run.
# Usage: bench/replicas_ack.sh   (after cargo build --release -p slidegate-server --features bench)
set -e
BIN=${BIN:-$(pwd)/target/release/slidegate}
ROUNDS=${ROUNDS:-3}
dir=$(mktemp -d)
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
M=$(port); R=$(port)
taskset -c 0 redis-server --port "$M" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --loglevel warning > "$dir/master.log" 2>&1 &
MPID=$!
taskset -c 0 redis-server --port "$R" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --replicaof 127.0.0.1 "$M" --loglevel warning > "$dir/replica.log" 2>&1 &
RPID=$!
trap 'kill $MPID $RPID; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do
  redis-cli -p "$M" INFO replication 2>/dev/null | grep -q 'slave0:.*state=online' && break
  sleep 0.1
done
for round in $(seq 1 "$ROUNDS"); do
  for keys in 10000 1; do
    for ack in 0 1; do
      redis-cli -p "$M" FLUSHALL > /dev/null
      taskset -c 1 "$BIN" bench --target "redis://127.0.0.1:$M" --redis-engine lua --keys "$keys" \
        --concurrency 64 --duration 5s --redis-replicas-ack "$ack" --json > "$dir/out.json"
      waits=$(redis-cli -p "$M" INFO commandstats | sed -n 's/^cmdstat_wait:calls=\([0-9]*\),.*/\1/p')
      redis-cli -p "$M" CONFIG RESETSTAT > /dev/null
      python3 -c 'import json,sys
r=json.load(open(sys.argv[1])); waits=int(sys.argv[5] or 0)
print("round %s, %5s keys, replicas_ack %s: %7.0f dec/s, p50 %s us, p99 %s us, errors %s, %.3f WAITs per admission" % (sys.argv[2],
  sys.argv[3], sys.argv[4], r["decisions_per_sec"], r["p50_us"], r["p99_us"], r.get("errors", 0), waits / max(r["allowed"], 1)))' \
        "$dir/out.json" "$round" "$keys" "$ack" "$waits"
    done
  done
done
