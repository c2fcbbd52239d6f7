#!/usr/bin/env python3
"""The price of a global exact limit behind nginx: requests/s through nginx with slidegate's
`auth_request` (docs/proxies.md's configuration as written), through nginx's own `limit_req` (a
per-instance leaky bucket, not shared), through nginx with no limit, and through the same
`auth_request` block asking a static nginx server instead (nginx's subrequest alone: the most any
auth_request service can reach); and what slidegate's
`/v1/auth-request/{rule}` costs beside a `/v1/check` of the same rule and key (callgrind).

    cargo build --release -p slidegate-server --features bench --bin slidegate
    python3 bench/proxy.py [--seconds 10] [--rounds 3]   # needs nginx, wrk, valgrind

Throughput: one nginx worker, wrk with 64 connections from one thread, the three set-ups taken in
turn for `--rounds` rounds (so that the machine's noise falls on each alike), the median kept.
The application behind nginx is a second nginx `server` answering `ok`; the rule admits every
request (its limit is far above the load), so each set-up does the same work for the client.
Instructions: `slidegate serve` under callgrind, zeroed before and dumped after each load, the
total divided by the requests wrk completed. Loopback only; every process started here is
ended here.
"""
import argparse, glob, os, re, shutil, signal, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_cost import REL, ROOT, free_port, total, wait_http  # noqa: E402

DOC = os.path.join(ROOT, "docs", "proxies.md")
# The addresses docs/proxies.md's nginx block names, replaced by free ports here.
SLIDEGATE, APP, PROXY = "127.0.0.1:8080", "127.0.0.1:3000", "127.0.0.1:8000"
RULES = """
[forward_auth]
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "api"
limit = 100000
window = "1s"
"""
# What nginx's auth_request sends for a client's `GET /`, as the documented block writes it.
AUTH_HEADERS = ["X-Forwarded-For: 127.0.0.1", "X-Forwarded-Method: GET", "X-Forwarded-Host: 127.0.0.1",
                "X-Forwarded-Uri: /", "X-Original-URI: /"]
CHECK_BODY = '{"rule":"api","key":"127.0.0.1"}'
# docs/proxies.md's nginx block with an nginx server in slidegate's place: auth_request's own cost.
FLOOR = "auth_request to a static 200"


def doc_block(marker, lang):
    text = open(DOC).read()
    section = text[text.index(f"\n{marker}\n"):]
    body = section[section.index(f"```{lang}\n") + len(lang) + 4:]
    return body[:body.index("```")]


def nginx_conf(d, setup, slidegate, app, port):
    """nginx.conf for `setup`, with the application on `app` and nginx on `port`."""
    if setup.startswith("auth_request"):
        # The floor: the same block asking a server of this nginx that answers every question
        # with an empty 200, so what is left is nginx's own subrequest.
        asked, floor = slidegate, ""
        if setup == FLOOR:
            asked = f"127.0.0.1:{free_port()}"
            floor = f"server {{ listen {asked}; location / {{ return 200; }} }}\n"
        site = doc_block("## nginx", "nginx").replace(SLIDEGATE, asked).replace(APP, app)
        site = site.replace(PROXY, f"127.0.0.1:{port}") + floor
    else:
        # limit_req at a rate far above the load: every request passes, as every one passes the rule.
        limited = setup == "limit_req"
        zone = "limit_req_zone $binary_remote_addr zone=api:10m rate=1000000r/s;\n" if limited else ""
        limit = "limit_req zone=api burst=1000000 nodelay;" if limited else ""
        site = (f"{zone}upstream application {{ server {app}; keepalive 16; }}\n"
                f"server {{ listen 127.0.0.1:{port}; location / {{ {limit} proxy_pass http://application; "
                "proxy_http_version 1.1; proxy_set_header Connection \"\"; } }\n")
    app_port = app.rsplit(":", 1)[1]
    return (f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n"
            f"events {{ worker_connections 1024; }}\nhttp {{\naccess_log off;\nclient_body_temp_path {d}/body;\n"
            f"proxy_temp_path {d}/proxy;\nfastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\n"
            f"scgi_temp_path {d}/scgi;\n"
            f"server {{ listen 127.0.0.1:{app_port}; location / {{ return 200 \"ok\\n\"; }} }}\n{site}\n}}\n")


def wrk(url, seconds, args=()):
    out = subprocess.run(["wrk", "-t1", "-c64", f"-d{seconds}s", *args, url], capture_output=True, text=True).stdout
    m = re.search(r"(\d+) requests in ([\d.]+)s", out)
    if not m:
        raise SystemExit(f"wrk said: {out}")
    if re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        raise SystemExit(f"answers that were not 2xx (the rule denied, or a set-up is broken): {out}")
    return int(m.group(1)), float(m.group(2))


def serve(rules_dir, port, prefix=()):
    rules = os.path.join(rules_dir, "rules.toml")
    with open(rules, "w") as f:
        f.write(RULES)
    cmd = [*prefix, os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}", "--config", rules]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return server


def stop(process):
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)


def throughput(seconds, rounds):
    work = tempfile.mkdtemp(prefix="proxy-bench-")
    slidegate_port, app = free_port(), f"127.0.0.1:{free_port()}"
    server = serve(work, slidegate_port)
    rates = {"none": [], "limit_req": [], "auth_request": [], FLOOR: []}
    try:
        for _ in range(rounds):
            for setup in rates:
                d = tempfile.mkdtemp(dir=work)
                port = free_port()
                with open(os.path.join(d, "nginx.conf"), "w") as f:
                    f.write(nginx_conf(d, setup, f"127.0.0.1:{slidegate_port}", app, port))
                nginx = subprocess.Popen(["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e", f"{d}/error.log"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    wait_http(f"http://127.0.0.1:{port}/")
                    wrk(f"http://127.0.0.1:{port}/", 1)  # connections and buffers settle first
                    requests, took = wrk(f"http://127.0.0.1:{port}/", seconds)
                    rates[setup].append(requests / took)
                finally:
                    stop(nginx)
    finally:
        stop(server)
        shutil.rmtree(work)
    return {setup: statistics.median(r) for setup, r in rates.items()}


def instructions(seconds):
    """Instructions per request of `/v1/check` and of `/v1/auth-request/api`, one server."""
    work = tempfile.mkdtemp(prefix="proxy-cost-")
    out = os.path.join(work, "callgrind.out")
    port = free_port()
    server = serve(work, port, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"])
    base = f"http://127.0.0.1:{port}"
    check = os.path.join(work, "check.lua")
    with open(check, "w") as f:
        f.write(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = \'{CHECK_BODY}\'\n')
    loads = {"/v1/check": (f"{base}/v1/check", ["-s", check]),
             "/v1/auth-request/{rule}": (f"{base}/v1/auth-request/api",
                                         [a for h in AUTH_HEADERS for a in ("-H", h)])}
    costs = {}
    try:
        for name, (url, args) in loads.items():
            wrk(url, 1, args)
            subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
            requests, _ = wrk(url, seconds, args)
            before = set(glob.glob(out + ".*"))
            subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
            dump = sorted(set(glob.glob(out + ".*")) - before)[-1]
            costs[name] = total(dump) / requests
    finally:
        stop(server)
        shutil.rmtree(work)
    return costs


def main():
    global REL
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bin-dir", default=REL, help="where slidegate is (default: target/release)")
    a = ap.parse_args()
    REL = a.bin_dir
    rates = throughput(a.seconds, a.rounds)
    print("| through nginx | requests/s | × limit_req | × auth_request's floor |")
    print("|---|---|---|---|")
    for setup, rate in rates.items():
        print(f"| {setup} | {rate:,.0f} | {rate / rates['limit_req']:.2f} | {rate / rates[FLOOR]:.2f} |", flush=True)
    costs = instructions(max(2, a.seconds // 2))
    print("\n| slidegate route (memory, one key) | instructions/request | × /v1/check |")
    print("|---|---|---|")
    for name, cost in costs.items():
        print(f"| `{name}` | {cost:,.0f} | {cost / costs['/v1/check']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
