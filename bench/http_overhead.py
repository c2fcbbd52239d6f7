#!/usr/bin/env python3
"""The service over HTTP on loopback, side by side in one run (issue: server benchmarks).

  1. memory backend: `slidegate serve` vs the bare axum baseline (examples/bare_axum.rs, a fixed
     decision-sized JSON answer), both driven by wrk with the same script and 64 connections;
     plus `slidegate bench --target http://…` against the service.
  2. Redis backend: the library straight at Redis (`slidegate bench --target redis://…`) vs the
     same load through the service (`--target http://…`, and wrk), 64 in flight: what HTTP adds
     to p99.
Shapes: one hot key (W1, 100 per 10 s) and 10,000 uniform keys (W2, 100 per 60 s).
Servers on CPU 1, load generators on CPU 0 (2-core machine). Loopback only; all processes ours.

    cargo build --release -p slidegate-server --features bench --bin slidegate --example bare_axum && python3 bench/http_overhead.py [--reps 6]

With `--pairs N`, only the memory-backend comparison: N pairs per shape of the service and the
bare axum handler, each pair back to back in alternating order, and the median of the pairs'
ratios (a quiet machine's answer to "how close to bare axum?").

With `--rates 2000,5000`, only an open-loop comparison instead (W2): at each fixed rate, the
library straight at Redis and the same load through the service (`slidegate bench --rate`),
back to back in alternating order: what the service adds to each decision's latency when
neither side is saturated.
"""
import argparse, json, os, re, socket, statistics, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
SHAPES = {"W1": (1, "10s"), "W2": (10_000, "60s")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url):
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=0.5)
            return
        except urllib.error.HTTPError:
            return  # an answer, if not a 200 (bare axum's 405 to a GET): the server is up
        except Exception:
            time.sleep(0.02)
    raise SystemExit(f"{url} did not come up")


def start(cmd, health, cpus="1"):
    p = subprocess.Popen(["taskset", "-c", cpus, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(health)
    return p


def stop(p):
    p.terminate()
    p.wait(10)


def wrk(url, keys, window, seconds):
    env = dict(os.environ, SLIDEGATE_KEYS=str(keys), SLIDEGATE_WINDOW=window)
    out = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c64", f"-d{seconds}s", "--latency", "-s",
                          os.path.join(ROOT, "bench", "check.lua"), url], capture_output=True, text=True, env=env).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    def us(label):
        m = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
    return {"rps": rps, "p50_us": us("50"), "p99_us": us("99")}


def bench(target, keys, window, seconds, rate=None):
    extra = ["--rate", str(rate)] if rate else []
    out = subprocess.run(["taskset", "-c", "0", os.path.join(REL, "slidegate"), "bench", "--target", target, "--keys",
                          str(keys), "--concurrency", "64", "--duration", f"{seconds}s", "--limit", "100", "--window",
                          window, "--json", *extra], capture_output=True, text=True).stdout
    v = json.loads(out)
    return {"rps": v["decisions_per_sec"], "p50_us": v["p50_us"], "p99_us": v["p99_us"], "errors": v["errors"],
            "late": v.get("late")}


def open_loop(rates, reps, seconds, redis_url, flush):
    """Library vs service at fixed rates (W2); prints a table of medians."""
    keys, window = SHAPES["W2"]
    port = free_port()
    p = start([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}", "--redis", redis_url],
              f"http://127.0.0.1:{port}/healthz", cpus="0,1")
    rows = {}
    try:
        for rep in range(reps):
            for rate in rates:
                r = {}
                sides = [("lib", redis_url), ("http", f"http://127.0.0.1:{port}")]
                for side, target in sides if rep % 2 == 0 else sides[::-1]:
                    flush()
                    r[side] = bench(target, keys, window, seconds, rate)
                rows.setdefault(rate, []).append(r)
                print(f"rep {rep + 1} {rate}/s: {json.dumps(r)}", file=sys.stderr)
    finally:
        stop(p)
    med = statistics.median
    print("| rate (W2) | library p50 · p99 µs | service p50 · p99 µs | p50 added (µs) | p99 service / library | late (library · service) |")
    print("|---|---|---|---|---|---|")
    for rate, reps_ in rows.items():
        g = lambda side, f: med([x[side][f] for x in reps_])
        added = med([x["http"]["p50_us"] - x["lib"]["p50_us"] for x in reps_])
        p99 = med([x["http"]["p99_us"] / max(x["lib"]["p99_us"], 1) for x in reps_])
        print(f"| {rate:,}/s | {g('lib', 'p50_us'):,.0f} · {g('lib', 'p99_us'):,.0f} | {g('http', 'p50_us'):,.0f} · "
              f"{g('http', 'p99_us'):,.0f} | {added:,.0f} | **{p99:.2f}** | {g('lib', 'late'):,.0f} · {g('http', 'late'):,.0f} |")


def pairs(n, seconds):
    """The service beside bare axum under wrk, `n` alternating pairs per shape."""
    print("| shape | bare axum (req/s, median) | slidegate (req/s, median) | ratio, median of pairs | pairs' range |")
    print("|---|---|---|---|---|")
    for shape, (keys, window) in SHAPES.items():
        got = []
        for i in range(n):
            r = {}
            for side in ("serve", "bare") if i % 2 == 0 else ("bare", "serve"):
                port = free_port()
                if side == "serve":
                    p = start([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}"],
                              f"http://127.0.0.1:{port}/healthz")
                else:
                    p = start([os.path.join(REL, "examples", "bare_axum"), f"127.0.0.1:{port}"], f"http://127.0.0.1:{port}/v1/check")
                r[side] = wrk(f"http://127.0.0.1:{port}/v1/check", keys, window, seconds)["rps"]
                stop(p)
            got.append(r)
            print(f"pair {i + 1} {shape}: {r} ratio {r['serve'] / r['bare']:.3f}", file=sys.stderr)
        ratios = sorted(x["serve"] / x["bare"] for x in got)
        med = statistics.median
        print(f"| {shape} | {med([x['bare'] for x in got]):,.0f} | {med([x['serve'] for x in got]):,.0f} "
              f"| **{med(ratios):.2f}** | {ratios[0]:.2f}–{ratios[-1]:.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rates", help="comma-separated decisions/s: run only the open-loop comparison")
    ap.add_argument("--pairs", type=int, help="run only this many service/bare-axum pairs per shape")
    a = ap.parse_args()
    if a.pairs:
        pairs(a.pairs, a.seconds)
        return
    redis_port = free_port()
    redis_dir = tempfile.mkdtemp(prefix="slidegate-bench-")
    redis = subprocess.Popen(["taskset", "-c", "1", "redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", redis_dir], stdout=subprocess.DEVNULL)
    redis_url = f"redis://127.0.0.1:{redis_port}"
    time.sleep(0.3)
    flush = lambda: subprocess.run(["redis-cli", "-p", str(redis_port), "FLUSHALL"], capture_output=True)
    rows = {}
    if a.rates:
        try:
            open_loop([int(x) for x in a.rates.split(",")], a.reps, a.seconds, redis_url, flush)
        finally:
            redis.terminate()
        return
    try:
        for rep in range(a.reps):
            for shape, (keys, window) in SHAPES.items():
                r = {}
                port = free_port()

                def serve_memory():
                    p = start([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}"],
                              f"http://127.0.0.1:{port}/healthz")
                    r["serve_wrk"] = wrk(f"http://127.0.0.1:{port}/v1/check", keys, window, a.seconds)
                    stop(p)

                def bare_axum():
                    bport = free_port()
                    p = subprocess.Popen(["taskset", "-c", "1", os.path.join(REL, "examples", "bare_axum"), f"127.0.0.1:{bport}"])
                    time.sleep(0.3)
                    r["bare_wrk"] = wrk(f"http://127.0.0.1:{bport}/v1/check", keys, window, a.seconds)
                    stop(p)

                # A shared machine's speed drifts over seconds: the two sides of the ratio run back to back,
                # in alternating order.
                for run in (serve_memory, bare_axum) if rep % 2 == 0 else (bare_axum, serve_memory):
                    run()
                p = start([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}"], f"http://127.0.0.1:{port}/healthz")
                r["serve_bench"] = bench(f"http://127.0.0.1:{port}", keys, window, a.seconds)
                stop(p)
                flush()
                r["redis_lib"] = bench(redis_url, keys, window, a.seconds)
                flush()
                # Three processes on two cores: the server is left to the scheduler here.
                p = start([os.path.join(REL, "slidegate"), "serve", "--http", f"127.0.0.1:{port}", "--redis", redis_url],
                          f"http://127.0.0.1:{port}/healthz", cpus="0,1")
                r["redis_http"] = bench(f"http://127.0.0.1:{port}", keys, window, a.seconds)
                flush()
                # The same through wrk, the other generator.
                r["redis_http_wrk"] = wrk(f"http://127.0.0.1:{port}/v1/check", keys, window, a.seconds)
                stop(p)
                rows.setdefault(shape, []).append(r)
                print(f"rep {rep + 1} {shape}: {json.dumps(r)}", file=sys.stderr)
    finally:
        redis.terminate()
    med = statistics.median
    print("| shape | bare axum, wrk (req/s) | slidegate memory, wrk (req/s) | ratio (target ≥ 0.85) | slidegate memory, slidegate bench (dec/s · p99 µs) | bench ÷ wrk "
          "| Redis via library (dec/s · p99 µs) | Redis via HTTP (dec/s · p99 µs) | p99 HTTP / library (target ≤ 1.25) "
          "| Redis via HTTP, wrk (req/s · p99 µs) | p99 ratio, wrk |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape, reps in rows.items():
        g = lambda k, f: med([x[k][f] for x in reps])
        ratio = med([x["serve_wrk"]["rps"] / x["bare_wrk"]["rps"] for x in reps])
        p99 = med([x["redis_http"]["p99_us"] / x["redis_lib"]["p99_us"] for x in reps])
        gen = med([x["serve_bench"]["rps"] / x["serve_wrk"]["rps"] for x in reps])
        p99_wrk = med([x["redis_http_wrk"]["p99_us"] / x["redis_lib"]["p99_us"] for x in reps])
        print(f"| {shape} | {g('bare_wrk', 'rps'):,.0f} | {g('serve_wrk', 'rps'):,.0f} | **{ratio:.2f}** "
              f"| {g('serve_bench', 'rps'):,.0f} · {g('serve_bench', 'p99_us'):,.0f} | **{gen:.2f}** "
              f"| {g('redis_lib', 'rps'):,.0f} · {g('redis_lib', 'p99_us'):,.0f} "
              f"| {g('redis_http', 'rps'):,.0f} · {g('redis_http', 'p99_us'):,.0f} | **{p99:.2f}** "
              f"| {g('redis_http_wrk', 'rps'):,.0f} · {g('redis_http_wrk', 'p99_us'):,.0f} | **{p99_wrk:.2f}** |")


if __name__ == "__main__":
    main()
