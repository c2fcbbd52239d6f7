#!/usr/bin/env bash
# Redis CPU per decision of slidegate's module beside redis-cell, counted in instructions:
# redis-server runs under callgrind, collecting inside processCommand (lookup, the command,
# replication bookkeeping, the reply), and redis-benchmark sends each system's command. Unlike
# timings on this shared 2-core VM, the counts repeat to within a fraction of a percent.
#
#   cargo build --release -p slidegate-module
#   REDIS_CELL_MODULE=path/to/libredis_cell.so bash bench/module_cost.sh [calls]
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-20000}
module=target/release/libslidegate_module.so
ours=crates/slidegate/src/redis/sliding_log.lua
seed=${SEED_SCRIPT:-../shared/peers/lua/sliding_log_servertime.lua}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)"; exit 1; }
[ -f "$module" ] || { echo "build the module first: cargo build --release -p slidegate-module"; exit 1; }

per_call() { # redis-benchmark args (@OURS@/@SEED@ = script SHAs) -> instructions per command
  local port out pid n ir
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out=$(mktemp)
  local load=(--loadmodule "$PWD/$module")
  [ -n "${REDIS_CELL_MODULE:-}" ] && load+=(--loadmodule "$REDIS_CELL_MODULE")
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=processCommand \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no "${load[@]}" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  local sha_ours sha_seed
  sha_ours=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$ours")")
  sha_seed=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$seed")")
  local args=("$@"); args=("${args[@]/@OURS@/$sha_ours}"); args=("${args[@]/@SEED@/$sha_seed}")
  redis-benchmark -p "$port" -n "$calls" -c 4 -P 16 -q "${args[@]}" >/dev/null 2>&1
  n=$(redis-cli -p "$port" INFO commandstats | sed -n 's/^cmdstat_\(slidegate.check\|cl.throttle\|evalsha\):calls=\([0-9]*\),.*/\2/p')
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$pid" || true
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  rm -f "$out"
  echo $((ir / n))
}

printf '| shape | module | Lua (slidegate) | seed script | redis-cell | module / cell |\n|---|---|---|---|---|---|\n'
for shape in "W1:-r 1000000000:hot:10000" "W2:-r 10000:k__rand_int__:60000"; do
  IFS=: read -r name rand key window <<<"$shape"
  # shellcheck disable=SC2086
  m=$(per_call $rand SLIDEGATE.CHECK "$key" sliding_log 100 "$window" 1)
  # shellcheck disable=SC2086
  l=$(per_call $rand EVALSHA @OURS@ 1 "$key" m__rand_int__ "" "$window" 99 -100 1 100)
  # shellcheck disable=SC2086
  s=$(per_call $rand EVALSHA @SEED@ 1 "$key" "$window" 100 __rand_int__)
  c=0
  # shellcheck disable=SC2086
  [ -n "${REDIS_CELL_MODULE:-}" ] && c=$(per_call $rand CL.THROTTLE "$key" 99 100 $((window / 1000)) 1)
  python3 -c "print(f'| $name | {$m:,} | {$l:,} | {$s:,} | {$c:,} | **{$m / max($c, 1):.2f}** |')"
done
