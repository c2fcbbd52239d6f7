#!/usr/bin/env bash
# The Debian package, tested as an operator installs it (CI runs this; it needs root, installs
# and then purges the package, so it is not part of scripts/test.sh):
#   1. builds it with cargo-deb (installed with `cargo install` when missing);
#   2. installs it with dpkg -i: the binary, the systemd unit, the conffiles, the user;
#   3. checks the unit with systemd-analyze verify, and the packaged rules file with
#      `slidegate validate`;
#   4. runs the unit's own ExecStart as the slidegate user (with systemd running, starts the
#      unit instead) and waits, bounded, for /healthz; then SIGTERM, and a clean exit;
#   5. purges the package.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
[ "$(id -u)" -eq 0 ] || { echo "test-deb: needs root (dpkg -i)" >&2; exit 1; }

if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
  echo "== cargo install cargo-deb $CARGO_DEB_VERSION"
  started=$SECONDS
  cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
  echo "cargo-deb installed in $((SECONDS - started)) s"
fi

echo "== cargo deb"
deb="$(cargo deb -p slidegate-server | tail -n 1)"
[ -f "$deb" ] || { echo "test-deb: no package at '$deb'" >&2; exit 1; }
echo "$deb"

pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  dpkg --purge slidegate >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== dpkg -i"
dpkg -i "$deb"
unit=/lib/systemd/system/slidegate.service
[ -f "$unit" ] || unit=/usr/lib/systemd/system/slidegate.service
for f in /usr/bin/slidegate /etc/slidegate/rules.toml /etc/default/slidegate "$unit"; do
  [ -f "$f" ] || { echo "test-deb: $f not installed" >&2; exit 1; }
done
getent passwd slidegate >/dev/null || { echo "test-deb: no slidegate user" >&2; exit 1; }
conffiles="$(dpkg-query --showformat='${Conffiles}\n' --show slidegate)"
for f in /etc/slidegate/rules.toml /etc/default/slidegate; do
  grep -q " $f " <<<"$conffiles" || { echo "test-deb: $f is not a conffile: $conffiles" >&2; exit 1; }
done
[ "$(stat -c %U:%G:%a /etc/slidegate/rules.toml)" = "root:slidegate:640" ] \
  || { echo "test-deb: rules.toml is $(stat -c %U:%G:%a /etc/slidegate/rules.toml)" >&2; exit 1; }

if command -v systemd-analyze >/dev/null; then
  echo "== systemd-analyze verify"
  systemd-analyze verify "$unit"
fi

echo "== slidegate validate (the packaged rules file)"
runuser -u slidegate -- /usr/bin/slidegate validate --config /etc/slidegate/rules.toml

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
exec_start="$(sed -n 's/^ExecStart=//p' "$unit")"
[ "$exec_start" = "/usr/bin/slidegate serve --config /etc/slidegate/rules.toml" ] \
  || { echo "test-deb: unexpected ExecStart=$exec_start" >&2; exit 1; }
log="$(mktemp)"
if [ -d /run/systemd/system ]; then
  echo "== systemctl start slidegate (SLIDEGATE_HTTP=127.0.0.1:$port)"
  mkdir -p /run/systemd/system/slidegate.service.d
  printf '[Service]\nEnvironment=SLIDEGATE_HTTP=127.0.0.1:%s\n' "$port" >/run/systemd/system/slidegate.service.d/test.conf
  systemctl daemon-reload
  systemctl restart slidegate
  pid="$(systemctl show --property MainPID --value slidegate)"
else
  echo "== no systemd running: the unit's ExecStart as the slidegate user (SLIDEGATE_HTTP=127.0.0.1:$port)"
  # setpriv execs (no child process in between), so $pid is the server's. ExecStart is split
  # into words, as systemd splits it.
  # shellcheck disable=SC2086
  setpriv --reuid=slidegate --regid=slidegate --init-groups env SLIDEGATE_HTTP="127.0.0.1:$port" $exec_start 2>"$log" &
  pid=$!
fi

for _ in $(seq 1 150); do
  if curl -fsS "http://127.0.0.1:$port/healthz" 2>/dev/null; then break; fi
  sleep 0.1
done
echo
health="$(curl -fsS --max-time 5 "http://127.0.0.1:$port/healthz")" || { cat "$log"; echo "test-deb: no /healthz" >&2; exit 1; }
[ "$health" = '{"status":"ok"}' ] || { echo "test-deb: /healthz said $health" >&2; exit 1; }
served_by="$(ps -o user= -p "$pid" | tr -d ' ')"
[ "$served_by" = "slidegate" ] || { echo "test-deb: served by '$served_by'" >&2; exit 1; }
echo "/healthz answered by the installed binary, as user $served_by"

if [ -d /run/systemd/system ]; then
  systemctl stop slidegate
  rm -rf /run/systemd/system/slidegate.service.d
else
  kill -TERM "$pid"
  wait "$pid" || { echo "test-deb: exit status $? after SIGTERM" >&2; cat "$log"; exit 1; }
fi
pid=""
rm -f "$log"

echo "== dpkg --purge"
dpkg --purge slidegate
[ ! -e /usr/bin/slidegate ] || { echo "test-deb: /usr/bin/slidegate left behind" >&2; exit 1; }
echo "test-deb: 1 passed, 0 failed"
