#!/usr/bin/env bash
# What a fresh Debian/Ubuntu machine lacks for the test suite, installed with apt-get:
# redis-server and redis-cli (the tests start their own servers), libclang (bindgen, for the
# Redis module crate, reads Redis' module header with it), python3 (the Python client of
# docs/service.md is run as written), curl (so is docs/middleware.md's session), and chromium
# with chromium-driver (the dashboard's tests drive a real headless browser), nginx, caddy and
# haproxy (docs/proxies.md's configurations are run as written in front of the binary).
set -euo pipefail

missing=()
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server redis-tools)
dpkg -s libclang-dev >/dev/null 2>&1 || missing+=(libclang-dev clang)
command -v python3 >/dev/null || missing+=(python3)
# python3-venv: scripts/test-python.sh builds the Python package into a venv of its own.
command -v python3 >/dev/null && python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v curl >/dev/null || missing+=(curl)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v nginx >/dev/null || missing+=(nginx)
command -v caddy >/dev/null || missing+=(caddy)
command -v haproxy >/dev/null || missing+=(haproxy)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]} (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
redis-server --version
