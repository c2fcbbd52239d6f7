#!/usr/bin/env bash
# The Python package's tests (bindings/python/tests): a venv of their own under target/, the
# package built and installed by pip from ./bindings/python as a user installs it (maturin is
# fetched by pip as the build backend; a debug build, as the tests need its behaviour, not its
# speed), and pytest over memory, real redis-server processes, a Cluster and the spawned
# `slidegate` binary (target/debug, built by scripts/test.sh before this runs). Ends with one
# line in libtest's form, which scripts/test.sh's summary counts.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/python" -m pip install -q --upgrade "./bindings/python[test]"

report="$(mktemp)"
trap 'rm -f "$report"' EXIT
status=0
(cd bindings/python && "../../$venv/bin/python" -m pytest -p no:cacheprovider -q --junitxml="$report" tests "$@") || status=$?
"$venv/bin/python" - "$report" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    suite = ET.parse(sys.argv[1]).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    tests, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    skipped = int(suite.get("skipped"))
except ET.ParseError:  # pytest stopped before running anything (a conftest that fails to import)
    tests, failed, skipped = 1, 1, 0
verdict = "ok" if sys.argv[2] == "0" else "FAILED"
failed = max(failed, int(sys.argv[2] != "0"))
print(f"test result: {verdict}. {tests - failed - skipped} passed; {failed} failed; {skipped} ignored (python, pytest)")
PY
exit "$status"
