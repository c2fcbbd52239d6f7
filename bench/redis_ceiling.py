#!/usr/bin/env python3
"""The Redis backend beside Redis' own ceiling, measured in one run (issue: core benchmarks).

For each shape (W1: one hot key, 100 per 10 s; W2: 10,000 uniform keys, 100 per 60 s) and each
repetition, interleaved:
  ceiling   redis-benchmark, 64 connections, -P 16, EVALSHA of the classic sorted-set script
            (bench/baselines/sliding_log_classic.lua)
  ours      `slidegate bench --target redis://…`, 64 in flight on one multiplexed connection
  seq       both again with one request at a time (-P 1 -c 1 / --concurrency 1), for p50
Redis CPU per decision is `usec_per_call` of EVALSHA from INFO commandstats, reset before each
run. Placement: concurrent runs put Redis on CPU 1 and the client on
CPU 0; sequential runs put both on CPU 0. Loopback only; every server is ours and stopped.

    cargo build --release -p slidegate-server --features bench && python3 bench/redis_ceiling.py [--reps 10] [--seconds 2]

Each repetition runs the two sides of each comparison back to back, in alternating order, and the
table reports medians of the per-repetition ratios: a shared machine's speed can drift by up to 2x
over seconds, so only comparisons made close together in time mean anything.
"""
import argparse, csv, io, json, os, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLIDEGATE = os.path.join(ROOT, "target", "release", "slidegate")
CLASSIC = os.path.join(ROOT, "bench", "baselines", "sliding_log_classic.lua")
SHAPES = {"W1": ("rl:w1:hot", "10000", "1000000", 1, "10s"), "W2": ("rl:w2:__rand_int__", "60000", "10000", 10_000, "60s")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="slidegate-bench-")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir], stdout=subprocess.DEVNULL)
        for _ in range(200):
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.02)
        raise SystemExit("redis-server did not start")

    def cli(self, *args):
        p = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        return p.stdout.strip()

    def pin(self, cpu):
        subprocess.run(["taskset", "-a", "-p", "-c", cpu, str(self.proc.pid)], capture_output=True)

    def usec_per_call(self):
        for line in self.cli("INFO", "commandstats").splitlines():
            if line.startswith("cmdstat_evalsha:"):
                return float(dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))["usec_per_call"])
        return float("nan")

    def fresh(self, cpu):
        self.pin(cpu)
        self.cli("FLUSHALL")
        self.cli("CONFIG", "RESETSTAT")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def redis_benchmark(r, sha, shape, conc, pipeline, n):
    key, win, rand, _, _ = SHAPES[shape]
    cmd = ["taskset", "-c", "0", "redis-benchmark", "-p", str(r.port), "-n", str(n), "-c", str(conc), "-P", str(pipeline),
           "-r", rand, "--csv", "EVALSHA", sha, "1", key, win, "100", "__rand_int__"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    row = list(csv.DictReader(io.StringIO(out)))[-1]
    return {"rps": float(row["rps"]), "p50_us": float(row["p50_latency_ms"]) * 1000, "p99_us": float(row["p99_latency_ms"]) * 1000}


def slidegate_bench(r, shape, conc, seconds):
    _, _, _, keys, window = SHAPES[shape]
    cmd = ["taskset", "-c", "0", SLIDEGATE, "bench", "--target", f"redis://127.0.0.1:{r.port}", "--keys", str(keys),
           "--concurrency", str(conc), "--duration", f"{seconds}s", "--limit", "100", "--window", window, "--json"]
    v = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout)
    return {"rps": v["decisions_per_sec"], "p50_us": v["p50_us"], "p99_us": v["p99_us"], "errors": v["errors"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=2)
    args = ap.parse_args()
    r = Redis()
    try:
        sha = r.cli("SCRIPT", "LOAD", open(CLASSIC).read())
        rows, rate = {}, {"W1": 100_000, "W2": 50_000}
        for rep in range(args.reps):
            for shape in ("W1", "W2"):
                res = {}

                def ceiling(conc, pipeline, key):
                    # As many calls as the last ceiling run made in `seconds`, so both sides run
                    # for about as long, close together in time.
                    r.fresh("1" if pipeline > 1 else "0")
                    n = int(rate[shape] * args.seconds) if pipeline > 1 else int(args.seconds * 15_000)
                    res[key] = redis_benchmark(r, sha, shape, conc, pipeline, max(n, 10_000))
                    res[key]["usec"] = r.usec_per_call()

                def ours(conc, key):
                    r.fresh("1" if conc > 1 else "0")
                    res[key] = slidegate_bench(r, shape, conc, args.seconds)
                    res[key]["usec"] = r.usec_per_call()

                # The machine's speed drifts over seconds: alternate which side goes first.
                pairs = [(lambda: ceiling(64, 16, "ceiling"), lambda: ours(64, "ours")),
                         (lambda: ceiling(1, 1, "ceiling_seq"), lambda: ours(1, "ours_seq"))]
                for first, second in pairs:
                    for run in ((first, second) if rep % 2 == 0 else (second, first)):
                        run()
                rate[shape] = res["ceiling"]["rps"]
                rows.setdefault(shape, []).append(res)
                print(f"rep {rep + 1} {shape}: " + json.dumps(res), file=sys.stderr)
        med = lambda xs: statistics.median(xs)
        print("| shape | ceiling -P 16 (dec/s) | slidegate 64 in flight (dec/s) | ratio (target ≥ 1.0) "
              "| Redis µs/call classic | Redis µs/call slidegate | ratio (target ≤ 1.1) "
              "| seq p50 redis-benchmark -P 1 (µs) | seq p50 slidegate (µs) | ratio (target ≤ 1.2) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for shape, reps in rows.items():
            c = med([x["ceiling"]["rps"] for x in reps]); o = med([x["ours"]["rps"] for x in reps])
            cu = med([x["ceiling"]["usec"] for x in reps]); ou = med([x["ours"]["usec"] for x in reps])
            cp = med([x["ceiling_seq"]["p50_us"] for x in reps]); op = med([x["ours_seq"]["p50_us"] for x in reps])
            tput = med([x["ours"]["rps"] / x["ceiling"]["rps"] for x in reps])
            cpu = med([x["ours"]["usec"] / x["ceiling"]["usec"] for x in reps])
            lat = med([x["ours_seq"]["p50_us"] / x["ceiling_seq"]["p50_us"] for x in reps])
            print(f"| {shape} | {c:,.0f} | {o:,.0f} | **{tput:.2f}** | {cu:.2f} | {ou:.2f} | **{cpu:.2f}** | {cp:.0f} | {op:.0f} | **{lat:.2f}** |")
    finally:
        r.stop()


if __name__ == "__main__":
    main()
