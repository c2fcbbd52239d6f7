#!/usr/bin/env python3
"""Instructions per HTTP request (callgrind), the measure that holds on a shared machine.

Servers: `slidegate serve` (memory backend) and the bare axum baseline (examples/bare_axum.rs)
under callgrind, each loaded by wrk (the same script and 64 connections as
bench/http_overhead.py) for a few seconds; the counters are zeroed when the load starts and
dumped when it ends, so start-up and shutdown are left out, and the total is divided by the
requests wrk completed. Generators: `slidegate bench --target http://…` and wrk under callgrind,
each against a `slidegate serve` running natively: their own instructions per request.

    cargo build --release -p slidegate-server --features bench --bin slidegate --example bare_axum
    python3 bench/http_cost.py [--seconds 5] [--keep DIR]   # needs valgrind, wrk

`--keep DIR` keeps each server's callgrind file there, for
`callgrind_annotate --inclusive=yes DIR/serve-W1.out`. Loopback only; every process started
here is ended here.
"""
import argparse, glob, os, re, shutil, signal, socket, subprocess, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
SHAPES = {"W1": (1, "10s"), "W2": (10_000, "60s")}
CHECK_LUA = os.path.join(ROOT, "bench", "check.lua")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, deadline_s=120, context=None):
    deadline = time.time() + deadline_s
    while True:
        try:
            # A GET: the baseline answers 405, which still says it is up.
            urllib.request.urlopen(url, timeout=5, context=context)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.time() > deadline:
                raise SystemExit(f"{url} did not come up")
            time.sleep(0.2)


def wrk(url, keys, window, seconds, connections=64, prefix=()):
    env = dict(os.environ, SLIDEGATE_KEYS=str(keys), SLIDEGATE_WINDOW=window)
    out = subprocess.run([*prefix, "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", CHECK_LUA, url],
                         capture_output=True, text=True, env=env).stdout
    m = re.search(r"(\d+) requests in", out)
    if not m:
        raise SystemExit(f"wrk said: {out}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return int(m.group(1)), int(errors.group(1)) if errors else 0


def total(path):
    with open(path) as f:
        for line in f:
            if m := re.match(r"(?:summary|totals): (\d+)", line):
                return int(m.group(1))
    raise SystemExit(f"no total in {path}")


def server_cost(cmd, port, keys, window, seconds, keep, name, scheme="http", context=None, marginal=False):
    """Instructions per request of `cmd` (a server on `port`, answering `scheme`) under wrk's load.
    Each wrk run opens its connections anew; with `marginal` their set-up (a TLS handshake each)
    is left out: loads of `seconds` and of twice that are measured, and the difference taken."""
    out_dir = tempfile.mkdtemp(prefix="http-cost-")
    out = os.path.join(out_dir, "callgrind.out")
    server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"{scheme}://127.0.0.1:{port}/v1/check"

    def measured(s):
        """(instructions, requests, errors) of one load of `s` seconds."""
        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
        requests, errors = wrk(url, keys, window, s)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
        dumps = glob.glob(out + ".*")
        if not dumps:
            raise SystemExit(f"no dump from {cmd[0]}")
        dump = max(dumps, key=lambda d: int(d.rsplit(".", 1)[1]))
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(dump, os.path.join(keep, f"{name}.out"))
        return total(dump), requests, errors

    try:
        wait_http(url, context=context)
        # One short load first: connections, buffers and the allocator's pools settle.
        wrk(url, keys, window, 1)
        instructions, requests, errors = measured(seconds)
        if marginal:
            more, more_requests, more_errors = measured(2 * seconds)
            instructions, requests, errors = more - instructions, more_requests - requests, errors + more_errors
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    shutil.rmtree(out_dir)
    return instructions / requests, requests, errors


def generator_cost(cmd, requests_of, keys, window, seconds):
    """Instructions per request of a load generator under callgrind, against a native server."""
    port = free_port()
    server = subprocess.Popen([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tempfile.mktemp(prefix="callgrind.gen.")
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                              *cmd(f"127.0.0.1:{port}", keys, window, seconds)],
                             capture_output=True, text=True, env=dict(os.environ, SLIDEGATE_KEYS=str(keys),
                                                                      SLIDEGATE_WINDOW=window))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    requests = requests_of(run.stdout)
    instructions = total(out)
    os.unlink(out)
    return instructions / requests, requests


def slidegate_bench(addr, keys, window, seconds):
    return [os.path.join(REL, "slidegate"), "bench", "--target", f"http://{addr}", "--keys", str(keys),
            "--concurrency", "64", "--duration", f"{seconds}s", "--limit", "100", "--window", window, "--json"]


def wrk_cmd(addr, keys, window, seconds):
    return ["wrk", "-t1", "-c64", f"-d{seconds}s", "-s", CHECK_LUA, f"http://{addr}/v1/check"]


def main():
    global REL
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--keep", help="keep the servers' callgrind files in this directory")
    ap.add_argument("--servers-only", action="store_true", help="leave out the load generators' own cost")
    ap.add_argument("--bin-dir", default=REL, help="where slidegate and examples/bare_axum are (default: target/release)")
    a = ap.parse_args()
    REL = a.bin_dir
    print("| shape | bare axum (instr./req) | slidegate (instr./req) | ratio | slidegate bench (instr./req) | wrk (instr./req) |")
    print("|---|---|---|---|---|---|")
    for shape, (keys, window) in SHAPES.items():
        port = free_port()
        bare, n_bare, _ = server_cost([os.path.join(REL, "examples", "bare_axum"), f"127.0.0.1:{port}"], port, keys,
                                      window, a.seconds, a.keep, f"bare-{shape}")
        port = free_port()
        serve, n_serve, errors = server_cost([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}"],
                                             port, keys, window, a.seconds, a.keep, f"serve-{shape}")
        if errors:
            raise SystemExit(f"{errors} answers were not 2xx")
        gen = ("", "")
        if not a.servers_only:
            import json
            bench, _ = generator_cost(slidegate_bench, lambda out: (lambda v: v["allowed"] + v["denied"])(json.loads(out)), keys, window,
                                      a.seconds)
            wrk_own, _ = generator_cost(wrk_cmd, lambda out: int(re.search(r"(\d+) requests in", out).group(1)),
                                        keys, window, a.seconds)
            gen = (f"{bench:,.0f}", f"{wrk_own:,.0f}")
        print(f"| {shape} | {bare:,.0f} | {serve:,.0f} | **{serve / bare:.2f}** | {gen[0]} | {gen[1]} |", flush=True)


if __name__ == "__main__":
    main()
