#!/usr/bin/env python3
"""The Envoy rate limit service over gRPC on loopback (issue: Envoy): decisions/s and p99 with
64 concurrent streams, one hot descriptor and 10,000 distinct ones, on the memory backend and on
Redis; the HTTP API beside it for scale. `slidegate serve --grpc` with bench/envoy/bench.yaml
(100 per minute per `key`), the load generator `slidegate bench --target grpc://…`. Server
(and Redis) on CPU 1, load on CPU 0; medians of --reps interleaved repetitions.

    cargo build --release -p slidegate-server --features bench && python3 bench/grpc.py [--reps 3]
"""
import argparse, json, os, statistics, subprocess, sys, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_ceiling import ROOT, SLIDEGATE, Redis, free_port  # noqa: E402


def serve(extra):
    http, grpc = free_port(), free_port()
    proc = subprocess.Popen(["taskset", "-c", "1", SLIDEGATE, "serve", "--http", f"127.0.0.1:{http}", "--grpc",
                             f"127.0.0.1:{grpc}", "--envoy-config", os.path.join(ROOT, "bench", "envoy"), *extra],
                            stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=1)
            return proc, http, grpc
        except OSError:
            time.sleep(0.02)
    raise SystemExit("slidegate did not start")


def bench(target, keys, seconds):
    cmd = ["taskset", "-c", "0", SLIDEGATE, "bench", "--target", target, "--keys", str(keys), "--concurrency", "64",
           "--duration", f"{seconds}s", "--limit", "100", "--window", "60s", "--json"]
    v = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout)
    if v["errors"]:
        raise SystemExit(f"{target}: {v['errors']} errors")
    return v["decisions_per_sec"], v["p99_us"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    r = Redis()
    r.pin("1")
    rows = {}
    try:
        for rep in range(args.reps):
            for backend, extra in (("memory", []), ("redis", ["--redis", f"redis://127.0.0.1:{r.port}"])):
                for keys in (1, 10_000):
                    r.cli("FLUSHALL")
                    proc, http, grpc = serve(extra)
                    try:
                        for proto, target in (("gRPC", f"grpc://127.0.0.1:{grpc}"), ("HTTP", f"http://127.0.0.1:{http}")):
                            res = bench(target, keys, args.seconds)
                            rows.setdefault((backend, keys, proto), []).append(res)
                            print(f"rep {rep + 1} {backend} {keys} {proto}: {res}", file=sys.stderr)
                    finally:
                        proc.terminate()
                        proc.wait(10)
    finally:
        r.stop()
    print("| backend | descriptors | protocol | decisions/s | p99 (µs) |")
    print("|---|---|---|---|---|")
    for (backend, keys, proto), reps in rows.items():
        print(f"| {backend} | {'one hot' if keys == 1 else f'{keys:,} distinct'} | {proto} "
              f"| {statistics.median(x[0] for x in reps):,.0f} | {statistics.median(x[1] for x in reps):,.0f} |")


if __name__ == "__main__":
    main()
