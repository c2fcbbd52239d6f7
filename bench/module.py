#!/usr/bin/env python3
"""slidegate's Redis module beside the Lua scripts, the classic sorted-set script and redis-cell, in one run.

    cargo build --release -p slidegate-module
    REDIS_CELL_MODULE=path/to/libredis_cell.so python3 bench/module.py [reps]

One redis-server (pinned to CPU 1, no persistence) loads slidegate's module and, when given,
redis-cell; redis-benchmark (pinned to CPU 0) sends each system's decision command, so every
system runs on the same server and client. Per run: decisions/s with 64 connections (-P 1: 64
in flight; -P 16: 1,024 in flight) and the CPU Redis spends inside the command (INFO
commandstats usec_per_call). Systems, rows interleaved rep by rep:

- module: SLIDEGATE.CHECK key sliding_log <limit> <window> 1 (the server's clock)
- lua:    slidegate's sliding_log.lua by EVALSHA (Redis' TIME), as the backend sends it
- classic: the classic sorted-set script (bench/baselines/sliding_log_classic.lua)
- cell:   redis-cell's CL.THROTTLE key <limit-1> <limit> <window s> 1 (GCRA, another algorithm)

Shapes: W1 one hot key, 100 per 10 s (after 100 admissions every call is
denied); W2 10,000 keys drawn at random, 100 per 60 s (nearly every call admits).
Then bytes per key (MEMORY USAGE ... SAMPLES 0) holding 100 and 10,000 admissions.
"""

import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODULE = os.path.join(ROOT, "target/release/libslidegate_module.so")
OURS = os.path.join(ROOT, "crates/slidegate/src/redis/sliding_log.lua")
CLASSIC = os.path.join(ROOT, "bench/baselines/sliding_log_classic.lua")
CELL = os.environ.get("REDIS_CELL_MODULE")
PORT = 7611
# 0 repetitions: the bytes per key only.
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3

SHAPES = {
    # name: (key, -r, limit, window ms, requests per run)
    "W1": ("hot", 1_000_000_000, 100, 10_000, 400_000),
    "W2": ("k:__rand_int__", 10_000, 100, 60_000, 300_000),
}


def cli(*args):
    out = subprocess.run(["redis-cli", "-p", str(PORT), *map(str, args)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def commands(shape, shas):
    key, _, limit, window, _ = SHAPES[shape]
    rows = {
        "module": ["SLIDEGATE.CHECK", key, "sliding_log", limit, window, 1],
        # id, window, limit - cost, the order (cost 1 on Redis' TIME: no more arguments): as the
        # backend guesses it once a run has started, look first for W1's denials, count first
        # ("") for W2's admissions
        "lua": ["EVALSHA", shas["ours"], 1, f"slidegate:{key}", "m__rand_int__", window, limit - 1,
                limit if shape == "W1" else ""],
        "classic": ["EVALSHA", shas["classic"], 1, key, window, limit, "__rand_int__"],
    }
    if CELL:
        rows["cell"] = ["CL.THROTTLE", key, limit - 1, limit, window // 1000, 1]
    return rows


def redis_cpu():
    info = dict(line.split(":", 1) for line in cli("INFO", "cpu").splitlines() if ":" in line)
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_stat(name):
    for line in cli("INFO", "commandstats").splitlines():
        if line.startswith(f"cmdstat_{name}:"):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            return float(fields["usec_per_call"])
    return float("nan")


def run(shape, system, args, pipeline):
    _, rand, _, _, n = SHAPES[shape]
    cli("FLUSHALL")
    cli("CONFIG", "RESETSTAT")
    cpu = redis_cpu()
    out = subprocess.run(
        ["taskset", "-c", "0", "redis-benchmark", "-p", str(PORT), "-c", "64", "-P", str(pipeline), "-n", str(n),
         "-r", str(rand), "--csv", *map(str, args)],
        capture_output=True, text=True, check=True,
    ).stdout
    cpu = (redis_cpu() - cpu) / n * 1e6
    rps = float(out.strip().splitlines()[-1].split(",")[1].strip('"'))
    name = {"module": "slidegate.check", "cell": "cl.throttle"}.get(system, "evalsha")
    return rps, command_stat(name), cpu


def bytes_per_key(args_for, admissions):
    cli("FLUSHALL")
    args = args_for(admissions)
    # One connection, pipelined: every call admits (the limit is far above `admissions`).
    subprocess.run(
        ["redis-benchmark", "-p", str(PORT), "-c", "1", "-P", "100", "-n", str(admissions), "-r", "1000000000", "-q",
         *map(str, args)],
        capture_output=True, check=True,
    )
    return int(cli("MEMORY", "USAGE", "mem", "SAMPLES", "0"))


def main():
    for path in (MODULE, OURS, CLASSIC):
        if not os.path.exists(path):
            sys.exit(f"missing {path} (cargo build --release -p slidegate-module)")
    server = ["taskset", "-c", "1", "redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--loadmodule", MODULE]
    if CELL:
        server += ["--loadmodule", CELL]
    redis = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                if cli("PING") == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.1)
        shas = {name: cli("SCRIPT", "LOAD", open(path).read()) for name, path in (("ours", OURS), ("classic", CLASSIC))}
        results = {}
        for rep in range(REPS):
            for shape in SHAPES:
                for system, args in commands(shape, shas).items():
                    for pipeline in (1, 16):
                        results.setdefault((shape, system, pipeline), []).append(run(shape, system, args, pipeline))
            print(f"rep {rep + 1}/{REPS} done", file=sys.stderr)
        if REPS:
            print(f"medians of {REPS}: decisions/s; Redis CPU per decision, µs: inside the command "
                  "(INFO commandstats) and all of it (INFO cpu, parsing and replies included)\n")
            print("| shape | system | -P 1 (64 in flight) | -P 16 | in command | all, -P 1 | all, -P 16 "
                  "| -P 16 throughput / module's |")
            print("|---|---|---|---|---|---|---|---|")
            med = lambda rows, i: statistics.median(r[i] for r in rows)
            for shape in SHAPES:
                base = med(results[(shape, "module", 16)], 0)
                for system in commands(shape, shas):
                    p1, p16 = results[(shape, system, 1)], results[(shape, system, 16)]
                    print(f"| {shape} | {system} | {med(p1, 0):,.0f}/s | {med(p16, 0):,.0f}/s | {med(p1 + p16, 1):.2f} "
                          f"| {med(p1, 2):.2f} | {med(p16, 2):.2f} | {med(p16, 0) / base:.2f} |")
        # Bytes per key holding n admissions (the window far above the run, the limit the largest
        # a sliding log takes, slidegate::MAX_LOG_LIMIT: every call admits).
        memory = {
            "module": lambda n: ["SLIDEGATE.CHECK", "mem", "sliding_log", 100_000, 3_600_000, 1],
            "lua": lambda n: ["EVALSHA", shas["ours"], 1, "mem", "m__rand_int__", 3_600_000, 99_999, ""],
            "classic": lambda n: ["EVALSHA", shas["classic"], 1, "mem", 3_600_000, 100_000, "__rand_int__"],
        }
        print("\n| system | bytes, key of 100 admissions | per admission | bytes, key of 10,000 | per admission |")
        print("|---|---|---|---|---|")
        sizes = {s: [bytes_per_key(f, n) for n in (100, 10_000)] for s, f in memory.items()}
        for system, (b100, b10k) in sizes.items():
            print(f"| {system} | {b100:,} | {b100 / 100:.1f} | {b10k:,} | {b10k / 10_000:.1f} |")
        print(f"\nmodule / classic at 100 admissions: {sizes['module'][0] / sizes['classic'][0]:.2f}; "
              f"at 10,000: {sizes['module'][1] / sizes['classic'][1]:.2f}")
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
