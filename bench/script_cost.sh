#!/usr/bin/env bash
# Redis CPU per decision, counted in instructions instead of seconds: redis-server runs under
# callgrind, redis-benchmark sends the same calls to each system, and the script prints
# instructions per call. Unlike usec_per_call on a shared machine, the counts repeat to within
# a fraction of a percent.
#
#   bash bench/script_cost.sh [calls]     (needs valgrind)
#   TABLES=4 PIPELINE=1 REDIS_CELL_MODULE=… bash bench/script_cost.sh   (table 4 alone, unpipelined)
#
# Table 1, the scripts (collected inside EVALSHA): the classic sorted-set script
# (bench/baselines/sliding_log_classic.lua) and slidegate's sliding-log script: sliding_log.lua
# for limits up to 256, counted_log.lua above (busy, and the token shapes, where the per-permit
# script's figures stand beside for comparison: it no longer runs there), with each shape's
# bytes per key (MEMORY USAGE of its first key) after the calls.
# Table 2, the counters: one_key.lua (fixed window, GCRA) and sliding_window.lua (the sliding
# window counter, 10 buckets) beside check.lua, which decides them in groups and with warm-up
# (collected inside EVALSHA); the last column sets each against the fixed window's one_key.lua.
# Table 3, when slidegate is built with the load generator (cargo build --release -p
# slidegate-server --features bench): the issue's own measure, collected inside processCommand
# while `slidegate bench --redis-engine lua` loads the server, per decision, each algorithm on
# W1 (one key, 100 per 10 s) and W2 (10,000 keys, 100 per 60 s), and each ÷ the fixed window.
# Table 4, when the module is built (cargo build --release -p slidegate-module), collected inside
# processCommand (command lookup, the command, replication bookkeeping, the reply): slidegate's
# module, both scripts, and redis-cell's CL.THROTTLE when REDIS_CELL_MODULE names its .so.
#
# Shapes: W1 one hot key, 100 per 10 s (after 100 admissions every call is a denial);
#         W2 fresh: keys drawn from 10,000 (nearly every call admits into a near-empty key);
#         W2 warm: keys drawn from 100 (admissions into keys holding ~15 entries on average);
#         busy: keys drawn from 30, 1,000 per 60 s (admissions into keys of ~50-100 entries).
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-3000}
tables=" ${TABLES:-1 2 3 4} "
# Commands per round trip: the reply goes to a client buffer holding others' (16) or to an empty one (1).
pipeline=${PIPELINE:-16}
classic=bench/baselines/sliding_log_classic.lua
ours=crates/slidegate/src/redis/sliding_log.lua
scripts=crates/slidegate/src/redis
module=target/release/libslidegate_module.so
slidegate=target/release/slidegate
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)"; exit 1; }

per_call() { # function to collect in, redis-benchmark args (@CLASSIC@/@OURS@ = SHAs) -> instructions per call
  local collect=$1; shift
  local port out pid n ir load=()
  [ -f "$module" ] && load+=(--loadmodule "$PWD/$module")
  [ -n "${REDIS_CELL_MODULE:-}" ] && load+=(--loadmodule "$REDIS_CELL_MODULE")
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect="$collect" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no "${load[@]}" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  # Only the script the call names is loaded: SCRIPT LOAD runs inside processCommand too.
  local args=("$@") name path
  for name in CLASSIC:$classic OURS:$ours COUNTED:$scripts/counted_log.lua CHECK:$scripts/check.lua ONE_KEY:$scripts/one_key.lua \
    SLIDING_WINDOW:$scripts/sliding_window.lua; do
    path=${name#*:} name=${name%%:*}
    [[ "$*" == *"@$name@"* ]] || continue
    args=("${args[@]/@$name@/$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$path")")}")
  done
  redis-benchmark -p "$port" -n "$calls" -c 4 -P "$pipeline" -q "${args[@]}" >/dev/null 2>&1
  [ -n "${BYTES_OF:-}" ] && redis-cli -p "$port" MEMORY USAGE "$BYTES_OF" SAMPLES 0 >"$bytes_file"
  n=$(redis-cli -p "$port" INFO commandstats |
    sed -n 's/^cmdstat_\(evalsha\|slidegate.check\|cl.throttle\):calls=\([0-9]*\),.*/\2/p')
  # A signal, not SHUTDOWN: that command would run inside processCommand and be counted.
  kill "$pid"
  wait "$pid" || true
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  rm -f "$out"
  echo $((ir / n))
}

shapes=("W1:-r 1000000:hot:10000:100" "W2 fresh:-r 10000:k__rand_int__:60000:100"
  "W2 warm:-r 100:k__rand_int__:60000:100" "busy:-r 30:k__rand_int__:60000:1000")
# Token limits: 100,000 per 60 s, keys drawn from 30, cost 1 and cost 1,000 (every call admits).
tokens=("tokens, cost 1:-r 30:k__rand_int__:60000:100000:1" "tokens, cost 1,000:-r 30:k__rand_int__:60000:100000:1000")
bytes_file=$(mktemp)
# Classic ARGV: window, limit, random token. Ours (cost 1, Redis' TIME): id, window, limit-cost,
# and the order: -(limit-cost+1) to look at the blocking entry first, "" to count first.
# The backend guesses a key's outcome from its last one: W1's denials run in the look-first
# order, the other shapes' admissions in the count-first order (ours_call).
calls_for() { # shape key window limit -> the arrays classic_call, look_call, count_call, ours_call
  classic_call=(EVALSHA @CLASSIC@ 1 "$2" "$3" "$4" __rand_int__)
  look_call=(EVALSHA @OURS@ 1 "$2" m__rand_int__ "$3" $(($4 - 1)) "$4")
  count_call=(EVALSHA @OURS@ 1 "$2" m__rand_int__ "$3" $(($4 - 1)) "")
  if [ "$1" = W1 ]; then ours_call=("${look_call[@]}"); else ours_call=("${count_call[@]}"); fi
}
# counted_log.lua's ARGV: id, window, limit, cost (Redis' TIME); sliding_log.lua's with a cost:
# id, window, limit-cost, order ("": count first), now ("": TIME), cost, limit.
limit_calls_for() { # key window limit cost -> the arrays counted_call, permit_call
  counted_call=(EVALSHA @COUNTED@ 1 "$1" m__rand_int__ "$2" "$3" "$4")
  permit_call=(EVALSHA @OURS@ 1 "$1" m__rand_int__ "$2" $(($3 - $4)) "" "" "$4" "$3")
}

[[ $tables == *" 1 "* ]] && {
  printf '| shape | classic script (instr/call) | slidegate, look first | slidegate, count first | ratio, the order the backend takes |\n'
  printf '|---|---|---|---|---|\n'
  for shape in "${shapes[@]}"; do
    IFS=: read -r name rand key window limit <<<"$shape"
    calls_for "$name" "$key" "$window" "$limit"
    # shellcheck disable=SC2086
    s=$(per_call evalShaCommand $rand "${classic_call[@]}")
    if [ "$limit" -gt 256 ]; then
      # One script, no order to take: counted_log.lua.
      limit_calls_for "$key" "$window" "$limit" 1
      # shellcheck disable=SC2086
      l=$(per_call evalShaCommand $rand "${counted_call[@]}")
      c=$l
    else
      # shellcheck disable=SC2086
      l=$(per_call evalShaCommand $rand "${look_call[@]}")
      # shellcheck disable=SC2086
      c=$(per_call evalShaCommand $rand "${count_call[@]}")
    fi
    taken=$c
    [ "$name" = W1 ] && taken=$l
    python3 -c "print(f'| $name | {$s:,} | {$l:,} | {$c:,} | **{$taken / $s:.2f}** |')"
  done
  printf '\n| limit > 256, 30 keys | calls | per-permit sliding_log.lua (instr/call) | B/key | counted_log.lua (instr/call) | B/key |\n'
  printf '|---|---|---|---|---|---|\n'
  all=$calls
  for shape in "busy:-r 30:k__rand_int__:60000:1000:1" "${tokens[@]}"; do
    IFS=: read -r name rand key window limit cost <<<"$shape"
    # A tenth of the calls at cost 1,000: the per-permit script writes 1,000 members per call.
    calls=$all
    [ "$cost" -gt 1 ] && calls=$((all / 10))
    limit_calls_for "$key" "$window" "$limit" "$cost"
    # shellcheck disable=SC2086
    p=$(BYTES_OF=k000000000000 per_call evalShaCommand $rand "${permit_call[@]}")
    pb=$(cat "$bytes_file")
    # shellcheck disable=SC2086
    c=$(BYTES_OF=k000000000000 per_call evalShaCommand $rand "${counted_call[@]}")
    cb=$(cat "$bytes_file")
    python3 -c "print(f'| $name | {$calls:,} | {$p:,} | {$pb:,} | {$c:,} | {$cb:,} |')"
  done
  calls=$all
}

[[ $tables == *" 2 "* ]] && {
  printf '\n| shape | algorithm | check.lua (instr/call) | lean script (instr/call) | ratio | ÷ fixed window |\n'
  printf '|---|---|---|---|---|---|\n'
  for shape in "${shapes[@]}"; do
    IFS=: read -r name rand key window limit <<<"$shape"
    te=$((window * 1000 / limit))
    # check.lua ARGV: id, now ("" = TIME), record, then algorithm limit window cost param period cold.
    # shellcheck disable=SC2086
    c=$(per_call evalShaCommand $rand EVALSHA @CHECK@ 1 "$key" m__rand_int__ "" 1 f "$limit" "$window" 1 0 0 0)
    # shellcheck disable=SC2086
    fixed=$(per_call evalShaCommand $rand EVALSHA @ONE_KEY@ 1 "$key" f "$window" "$limit" 1)
    python3 -c "print(f'| $name | fixed_window | {$c:,} | {$fixed:,} | **{$fixed / $c:.2f}** | 1.00 |')"
    # shellcheck disable=SC2086
    c=$(per_call evalShaCommand $rand EVALSHA @CHECK@ 1 "$key" m__rand_int__ "" 1 g "$limit" "$window" 1 "$limit" 0 0)
    # shellcheck disable=SC2086
    o=$(per_call evalShaCommand $rand EVALSHA @ONE_KEY@ 1 "$key" g "$te" $((limit * te)) "$te")
    python3 -c "print(f'| $name | gcra | {$c:,} | {$o:,} | **{$o / $c:.2f}** | {$o / $fixed:.2f} |')"
    # shellcheck disable=SC2086
    c=$(per_call evalShaCommand $rand EVALSHA @CHECK@ 1 "$key" m__rand_int__ "" 1 w "$limit" "$window" 1 10 0 0)
    # shellcheck disable=SC2086
    o=$(per_call evalShaCommand $rand EVALSHA @SLIDING_WINDOW@ 1 "$key" $((window / 10)) 10 "$limit" 1)
    python3 -c "print(f'| $name | sliding_window | {$c:,} | {$o:,} | **{$o / $c:.2f}** | **{$o / $fixed:.2f}** |')"
  done
}


per_decision() { # slidegate bench args -> instructions inside processCommand per decision
  local port out pid n ir
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=processCommand \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  "$slidegate" bench --target "redis://127.0.0.1:$port" --redis-engine lua --concurrency 16 --json "$@" >/dev/null
  n=$(redis-cli -p "$port" INFO commandstats | awk -F'[:=,]' '/^cmdstat_eval(sha)?:/ { n += $3 } END { print n }')
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$pid" || true
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  rm -f "$out"
  echo $((ir / n))
}

if [[ $tables == *" 3 "* && -x "$slidegate" ]]; then
  printf '\n| shape | sliding_log | sliding_window | fixed_window | gcra | sliding_window ÷ fixed_window |\n'
  printf '|---|---|---|---|---|---|\n'
  for shape in "W1:1:10s" "W2:10000:60s"; do
    IFS=: read -r name keys window <<<"$shape"
    declare -A cost=()
    for algorithm in sliding_log sliding_window fixed_window gcra; do
      cost[$algorithm]=$(per_decision --keys "$keys" --limit 100 --window "$window" --algorithm "$algorithm" \
        --duration "${BENCH_DURATION:-10s}")
    done
    python3 -c "print(f'| $name | {${cost[sliding_log]}:,} | {${cost[sliding_window]}:,} | {${cost[fixed_window]}:,} | {${cost[gcra]}:,} | **{${cost[sliding_window]} / ${cost[fixed_window]}:.2f}** |')"
  done
fi

[[ $tables == *" 4 "* && -f "$module" ]] || exit 0
printf '\n| shape | module | slidegate script | classic script | redis-cell | module / classic | module / cell |\n'
printf '|---|---|---|---|---|---|---|\n'
for shape in "${shapes[@]}"; do
  IFS=: read -r name rand key window limit <<<"$shape"
  calls_for "$name" "$key" "$window" "$limit"
  # shellcheck disable=SC2086
  m=$(per_call processCommand $rand SLIDEGATE.CHECK "$key" sliding_log "$limit" "$window" 1)
  # shellcheck disable=SC2086
  o=$(per_call processCommand $rand "${ours_call[@]}")
  # shellcheck disable=SC2086
  s=$(per_call processCommand $rand "${classic_call[@]}")
  c=0
  # shellcheck disable=SC2086
  [ -n "${REDIS_CELL_MODULE:-}" ] && c=$(per_call processCommand $rand CL.THROTTLE "$key" $((limit - 1)) "$limit" $((window / 1000)) 1)
  python3 -c "c = $c; cell, ratio = (f'{c:,}', f'**{$m / c:.2f}**') if c else ('–', '–'); print(f'| $name | {$m:,} | {$o:,} | {$s:,} | {cell} | **{$m / $s:.2f}** | {ratio} |')"
done
