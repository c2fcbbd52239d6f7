#!/usr/bin/env bash
# Redis CPU per decision, counted in instructions instead of seconds: redis-server runs under
# callgrind (collecting only inside EVALSHA), redis-benchmark sends the same calls to the seed's
# sliding-log script and to slidegate's, and the script prints instructions per call. Unlike
# usec_per_call on a shared 2-core VM, the counts repeat to within a fraction of a percent.
#
#   bash bench/script_cost.sh [calls]     (needs valgrind; the seed script from ../shared/peers)
#
# Shapes: W1 one hot key, 100 per 10 s (after 100 admissions every call is a denial);
#         W2 fresh: keys drawn from 10,000 (nearly every call admits into a near-empty key);
#         W2 warm: keys drawn from 100 (admissions into keys holding ~15 entries on average).
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-3000}
seed=${SEED_SCRIPT:-../shared/peers/lua/sliding_log_servertime.lua}
ours=crates/slidegate/src/redis/sliding_log.lua
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)"; exit 1; }
[ -f "$seed" ] || { echo "seed script not found at $seed (set SEED_SCRIPT)"; exit 1; }

per_call() { # script, redis-benchmark args with @SHA@ -> instructions per EVALSHA
  local script=$1; shift
  local port out pid sha n ir
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=evalShaCommand \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
  local args=("$@"); args=("${args[@]/@SHA@/$sha}")
  redis-benchmark -p "$port" -n "$calls" -c 4 -P 16 -q "${args[@]}" >/dev/null 2>&1
  n=$(redis-cli -p "$port" INFO commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$pid" || true
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  rm -f "$out"
  echo $((ir / n))
}

# Seed ARGV: window, limit, random token. Ours: id, now ("" = TIME), window, limit-cost,
# -(limit-cost+1), cost, limit.
printf '| shape | seed script (instr/call) | slidegate (instr/call) | ratio |\n|---|---|---|---|\n'
for shape in "W1:-r 1000000:hot:10000" "W2 fresh:-r 10000:k__rand_int__:60000" "W2 warm:-r 100:k__rand_int__:60000"; do
  IFS=: read -r name rand key window <<<"$shape"
  # shellcheck disable=SC2086
  s=$(per_call "$seed" $rand EVALSHA @SHA@ 1 "$key" "$window" 100 __rand_int__)
  # shellcheck disable=SC2086
  o=$(per_call "$ours" $rand EVALSHA @SHA@ 1 "$key" m__rand_int__ "" "$window" 99 -100 1 100)
  python3 -c "print(f'| $name | {$s:,} | {$o:,} | **{$o / $s:.2f}** |')"
done
