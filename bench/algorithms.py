#!/usr/bin/env python3
"""Decisions per second and Redis CPU per decision for each algorithm (issue: algorithms).

For each repetition, shape and algorithm, interleaved: `slidegate bench` with 64 in flight
against a redis-server started here (Redis pinned to CPU 1, the load generator to CPU 0;
Redis CPU per decision = EVALSHA usec_per_call from INFO commandstats, reset before each run)
and against the memory backend (the load generator on both CPUs). Shapes: W1 one hot key, 100 per 10 s; W2 10,000 uniform keys, 100 per 60 s.
Medians of the repetitions. Loopback only; the server is ours and stopped.

    cargo build --release -p slidegate-server --features bench && python3 bench/algorithms.py [--reps 3]
"""
import argparse, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_ceiling import SLIDEGATE, Redis  # noqa: E402

SHAPES = {"W1": (1, "10s"), "W2": (10_000, "60s")}
ALGORITHMS = ["sliding_log", "sliding_window", "fixed_window", "gcra"]


def bench(target, shape, algorithm, seconds, cpus):
    keys, window = SHAPES[shape]
    cmd = ["taskset", "-c", cpus, SLIDEGATE, "bench", "--target", target, "--keys", str(keys), "--concurrency", "64",
           "--duration", f"{seconds}s", "--limit", "100", "--window", window, "--algorithm", algorithm, "--json"]
    v = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout)
    if v["errors"]:
        raise SystemExit(f"{target} {shape} {algorithm}: {v['errors']} errors")
    return v["decisions_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3)
    args = ap.parse_args()
    r = Redis()
    rows = {}
    try:
        for rep in range(args.reps):
            for shape in SHAPES:
                for algorithm in ALGORITHMS:
                    r.fresh("1")
                    redis = bench(f"redis://127.0.0.1:{r.port}", shape, algorithm, args.seconds, "0")
                    usec = r.usec_per_call()
                    memory = bench("memory", shape, algorithm, args.seconds, "0-1")
                    rows.setdefault((shape, algorithm), []).append((redis, usec, memory))
                    print(f"rep {rep + 1} {shape} {algorithm}: redis {redis:,.0f}/s {usec:.2f} µs/call, "
                          f"memory {memory:,.0f}/s", file=sys.stderr)
    finally:
        r.stop()
    med = lambda xs: statistics.median(xs)
    print("| shape | algorithm | Redis, 64 in flight (dec/s) | Redis µs per decision | memory, 64 in flight (dec/s) |")
    print("|---|---|---|---|---|")
    for (shape, algorithm), reps in rows.items():
        print(f"| {shape} | {algorithm} | {med([x[0] for x in reps]):,.0f} | {med([x[1] for x in reps]):.2f} "
              f"| {med([x[2] for x in reps]):,.0f} |")


if __name__ == "__main__":
    main()
