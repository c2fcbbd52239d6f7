#!/bin/sh
# Redis over TLS against plaintext: one redis-server (CPU 0) on both ports, `slidegate bench`
# (CPU 1) with 64 in flight, 5 s per run; the client's CPU (user + sys) per decision, first as
# fast as Redis answers, then at one fixed rate for both (RATE, default 40000 decisions/s).
# Usage: bench/redis_tls.sh DIR, where DIR holds ca.pem, server.pem and server.key.
set -e
BIN=${BIN:-$(pwd)/target/release/slidegate}
RATE=${RATE:-40000}
cd "$1"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
P=$(port); T=$(port)
taskset -c 0 redis-server --port "$P" --tls-port "$T" --bind 127.0.0.1 --save '' --appendonly no \
  --tls-cert-file server.pem --tls-key-file server.key --tls-ca-cert-file ca.pem --tls-auth-clients no \
  --loglevel warning > redis.log 2>&1 &
RPID=$!
sleep 1
for rate in "" "$RATE"; do
  for keys in 1 10000; do
    for url in "redis://127.0.0.1:$P" "rediss://127.0.0.1:$T"; do
      redis-cli -p "$P" FLUSHALL > /dev/null
      SSL_CERT_FILE=ca.pem /usr/bin/time -f "%U %S" -o time.txt \
        taskset -c 1 "$BIN" bench --target "$url" --keys "$keys" --concurrency 64 --duration 5s \
        ${rate:+--rate "$rate"} --json > out.json
      python3 -c 'import json,sys
r=json.load(open("out.json")); u,s=map(float,open("time.txt").read().split()[-2:])
n=r["allowed"]+r["denied"]
print(sys.argv[1] or "as fast", sys.argv[2], sys.argv[3], "%.0f dec/s" % r["decisions_per_sec"], "%.2f us client CPU/decision" % ((u+s)/n*1e6))' "$rate" "$keys" "$url"
    done
  done
done
kill "$RPID"
