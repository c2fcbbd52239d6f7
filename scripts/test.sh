#!/usr/bin/env bash
# The whole test suite, on a fresh Debian/Ubuntu machine too: installs what is missing
# (scripts/setup.sh: redis-server, and libclang for the Redis module's build), then runs every
# test of every crate with every feature. The Redis tests start their own servers on free
# loopback ports, some with the module crate's build loaded (`--loadmodule`).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
# Everything is built first, so that a compile error shows once and the tests' time is their own
# (the testkit would otherwise build the Redis module the tests load, on first use).
cargo build --workspace --all-features 2>&1 | tee "$log" || status=$?
[ "$status" -eq 0 ] && { cargo test --workspace --all-features --all-targets "$@" 2>&1 | tee -a "$log" || status=$?; }
if [ "$status" -eq 0 ]; then
  cargo test --workspace --all-features --doc 2>&1 | tee -a "$log" || status=$?
fi
# The Python package (bindings/python): built by pip into a venv of its own, tested by pytest.
if [ "$status" -eq 0 ]; then
  bash scripts/test-python.sh 2>&1 | tee -a "$log" || status=$?
fi

# One closing line over every suite (libtest prints one "test result" line per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "summary: %d passed, %d failed, %d skipped\n", p, f, s }' "$log" | tee "${SLIDEGATE_SUMMARY:-/dev/null}"
exit "$status"
