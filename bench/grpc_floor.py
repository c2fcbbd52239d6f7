#!/usr/bin/env python3
"""The Envoy gRPC service against its framework's floor and against limitador (issue 23).

Instructions per `ShouldRateLimit` of each server process, counted by callgrind (the count a
shared machine cannot disturb): the server runs under valgrind, a warm-up load runs, the counts
are zeroed, a measured load of `slidegate bench --target grpc://…` runs (64 calls in flight), the
counts are dumped and divided by the calls it made. Servers:
  bare       examples/bare_tonic.rs: a fixed answer, served as `serve --grpc` serves
  slidegate  `slidegate serve --grpc`, bench/envoy/bench.yaml (100 per minute per `key`)
  limitador  Kuadrant/limitador's server (LIMITADOR_BIN), the same limit, when given
Workloads: W1 one hot descriptor, W2 10,000 distinct descriptor values; memory backend (and
Redis with --redis).

    cargo build --release -p slidegate-server --features bench --bin slidegate --example bare_tonic
    LIMITADOR_BIN=…/limitador-server python3 bench/grpc_floor.py [--redis] [--keep DIR]

`--wall` measures calls/s instead (no valgrind; server and Redis on CPU 1, load on CPU 0, the
servers' order alternating per repetition; medians of the per-repetition ratios): wall-clock
figures mean something only on a quiet machine. The load is `slidegate bench` for both
workloads: its 64 calls are streams of one HTTP/2 connection, driven in one task with it, each
key's request encoded once: ~27,000 instructions per call, about half the cheapest server's
(bare, ~51,000), so the server's core saturates before the load's (but see below on one
connection). `--h2load` loads W1 with
h2load instead (one connection, 64 streams, one prebuilt request: ~13,500).

    LIMITADOR_BIN=…/limitador-server python3 bench/grpc_floor.py --wall --redis [--h2load] [--connections 2] [--reps 5] [--seconds 5]

On one connection (the default, h2load's `-c 1 -m 64`) server and load take turns: the load
sends its 64 calls in one write and waits, the server answers them in one write and waits, so
the calls/s are bound by the sum of both costs, h2load's as well (W1, quiet machine: bare 174k,
server 81% of its core). `--connections 2` splits the 64 calls over two connections (for
`slidegate bench` and h2load alike): the server works on one while the load works on the
other, and its core saturates (bare 210k W1 and 217k W2, server 99%).

That the generator is not what bounds a figure can be checked. `--generators` counts its own
instructions per call (callgrind on `slidegate bench` for W1 and W2 and on h2load for W1, each
against a natively running `slidegate serve --grpc`; `--bench-bin` another build's `slidegate`,
e.g. an older generator's), which must stay well below the servers' counts above. Each `--wall`
run prints the CPU the server and the load used: the server's core near 100% and the load's
below it say the server is the bound. And two generator processes against one server (two
`slidegate bench --concurrency 32` at once) must not add calls/s beyond what one gets with
`--connections 2`: on one connection they do (~135k → ~210k for bare), the turn-taking above.

    python3 bench/grpc_floor.py --generators [--bench-bin PATH]
"""
import argparse, glob, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_ceiling import ROOT, SLIDEGATE, Redis, free_port  # noqa: E402

BARE = os.path.join(ROOT, "target", "release", "examples", "bare_tonic")
LIMITADOR = os.environ.get("LIMITADOR_BIN")
WORKLOADS = {"W1": 1, "W2": 10_000}
# limitador's form of bench/envoy/bench.yaml: 100 per minute per descriptor `key` of domain `bench`.
LIMITADOR_LIMITS = """- namespace: bench
  max_value: 100
  seconds: 60
  conditions: []
  variables:
    - descriptors[0].key
"""


def command(system, backend, redis, grpc, workdir):
    if system == "bare":
        return [BARE, f"127.0.0.1:{grpc}"]
    store = ["--redis", f"redis://127.0.0.1:{redis.port}"] if backend == "redis" else []
    if system == "slidegate":
        return [SLIDEGATE, "serve", "--http", f"127.0.0.1:{free_port()}", "--grpc", f"127.0.0.1:{grpc}",
                "--envoy-config", os.path.join(ROOT, "bench", "envoy"), *store]
    limits = os.path.join(workdir, "limits.yaml")
    with open(limits, "w") as f:
        f.write(LIMITADOR_LIMITS)
    store = ["redis", f"redis://127.0.0.1:{redis.port}"] if backend == "redis" else ["memory"]
    return [LIMITADOR, "-b", "127.0.0.1", "-p", str(grpc), "-B", "127.0.0.1", "-P", str(free_port()), limits, *store]


def start(cmd, grpc, deadline_s):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", grpc), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not start")


def bench_cmd(grpc, keys, seconds, connections=1, binary=SLIDEGATE):
    return [binary, "bench", "--target", f"grpc://127.0.0.1:{grpc}", "--keys", str(keys), "--concurrency", "64",
            *(["--connections", str(connections)] if connections > 1 else []), "--duration", f"{seconds}s", "--json"]


def report(out):
    v = json.loads(out)
    if v["errors"]:
        raise SystemExit(f"{v['errors']} failed calls")
    return v


def load(grpc, keys, seconds, connections=1):
    cmd = ["taskset", "-c", "0", *bench_cmd(grpc, keys, seconds, connections)]
    return report(subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120).stdout)


def cpu_s(pid):
    """CPU seconds (user and system) process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    """CPU seconds the processes this one has waited for used."""
    t = os.times()
    return t.children_user + t.children_system


def h2load_cmd(grpc, seconds, workdir, connections=1, scheme="http"):
    """h2load's W1: 64 streams over `connections` connections, each a prebuilt request (over
    TLS for `scheme` "https": h2load negotiates HTTP/2 by ALPN and checks no certificate)."""
    pb = lambda field, payload: bytes([field << 3 | 2, len(payload)]) + payload
    request = pb(1, b"bench") + pb(2, pb(1, pb(1, b"key") + pb(2, b"bench:0")))
    body = os.path.join(workdir, "w1.grpc")
    with open(body, "wb") as f:
        f.write(b"\0" + len(request).to_bytes(4, "big") + request)
    url = f"{scheme}://127.0.0.1:{grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    return ["h2load", "-c", str(connections), "-m", str(64 // connections), "-D", str(int(seconds)), "-d", body,
            "-H", "content-type: application/grpc", "-H", "te: trailers", url]


def h2load_report(out):
    """(calls, calls/s) of h2load's output, when no call failed."""
    if "0 failed, 0 errored" not in out:
        raise SystemExit(f"h2load: failed calls\n{out}")
    return int(out.split(" succeeded")[0].rsplit(" ", 1)[1]), float(out.split(" req/s")[0].rsplit(" ", 1)[1])


def h2load(grpc, seconds, workdir, connections=1):
    """W1's calls/s from h2load."""
    cmd = ["taskset", "-c", "0", *h2load_cmd(grpc, seconds, workdir, connections)]
    return h2load_report(subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout)[1]


def instructions(system, backend, keys, redis, args, workdir):
    grpc = free_port()
    out = os.path.join(workdir, f"callgrind.{system}.{backend}.{keys}")
    valgrind = ["taskset", "-c", "1", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    proc = start(valgrind + command(system, backend, redis, grpc, workdir), grpc, 120)
    try:
        load(grpc, keys, args.warmup)
        subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True, capture_output=True)
        measured = load(grpc, keys, args.seconds)
        calls = measured["allowed"] + measured["denied"]
        subprocess.run(["callgrind_control", "--dump", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(60)
    dump = max(glob.glob(out + ".*"), key=os.path.getmtime)
    with open(dump) as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    return total / calls, calls, dump


def measure_instructions(systems, backends, redis, args, workdir):
    rows = {}
    for backend in backends:
        for shape, keys in WORKLOADS.items():
            for system in systems:
                if system == "bare" and backend == "redis":
                    continue
                if redis:
                    redis.cli("FLUSHALL")
                per_call, calls, dump = instructions(system, backend, keys, redis, args, workdir)
                rows[(backend, shape, system)] = per_call
                print(f"{backend} {shape} {system}: {per_call:,.0f} instructions per call over {calls:,} calls ({dump})",
                      file=sys.stderr)
    print("| backend | workload | " + " | ".join(systems) + " | slidegate / bare | limitador / slidegate |")
    print("|---|---|" + "---|" * (len(systems) + 2))
    for backend in backends:
        for shape in WORKLOADS:
            got = [rows.get((backend, shape, s)) for s in systems]
            cells = " | ".join("" if g is None else f"{g:,.0f}" for g in got)
            ratio = lambda a, b: f"{rows[(backend, shape, a)] / rows[(backend, shape, b)]:.2f}" \
                if (backend, shape, a) in rows and (backend, shape, b) in rows else ""
            print(f"| {backend} | {shape} | {cells} | {ratio('slidegate', 'bare')} | {ratio('limitador', 'slidegate')} |")


def generator_cost(cmd, calls_of, workdir, name):
    """Instructions per call of the generator `cmd(grpc)` under callgrind (CPU 0, start-up and
    all), against a `slidegate serve --grpc` running natively on CPU 1."""
    grpc = free_port()
    server = start(["taskset", "-c", "1", *command("slidegate", "memory", None, grpc, workdir)], grpc, 30)
    out = os.path.join(workdir, f"callgrind.generator.{name}")
    try:
        run = subprocess.run(["taskset", "-c", "0", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                              *cmd(grpc)], capture_output=True, text=True, timeout=600)
    finally:
        server.terminate()
        server.wait(10)
    with open(out) as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    calls = calls_of(run.stdout)
    return total / calls, calls


def measure_generators(args, workdir):
    rows = []
    for shape, keys in WORKLOADS.items():
        cost, calls = generator_cost(lambda grpc: bench_cmd(grpc, keys, args.seconds, binary=args.bench_bin),
                                     lambda out: report(out)["allowed"] + report(out)["denied"], workdir,
                                     f"bench.{shape}")
        rows.append(("slidegate bench", shape, cost))
        print(f"slidegate bench {shape}: {cost:,.0f} instructions per call over {calls:,} calls", file=sys.stderr)
    cost, calls = generator_cost(lambda grpc: h2load_cmd(grpc, args.seconds, workdir),
                                 lambda out: h2load_report(out)[0], workdir, "h2load.W1")
    rows.append(("h2load", "W1", cost))
    print(f"h2load W1: {cost:,.0f} instructions per call over {calls:,} calls", file=sys.stderr)
    print("| generator | W1 | W2 |")
    print("|---|---|---|")
    for generator in ("slidegate bench", "h2load"):
        cells = {shape: f"{cost:,.0f}" for g, shape, cost in rows if g == generator}
        print(f"| {generator} | {cells.get('W1', '')} | {cells.get('W2', '')} |")


def measure_wall(systems, backends, redis, args, workdir):
    rows = {}
    for rep in range(args.reps):
        for backend in backends:
            for shape, keys in WORKLOADS.items():
                order = [s for s in systems if not (s == "bare" and backend == "redis")]
                for system in order if rep % 2 == 0 else reversed(order):
                    if redis:
                        redis.cli("FLUSHALL")
                    grpc = free_port()
                    proc = start(["taskset", "-c", "1", *command(system, backend, redis, grpc, workdir)], grpc, 30)
                    try:
                        before = (time.time(), cpu_s(proc.pid), children_cpu_s())
                        if args.h2load and shape == "W1":
                            rate = h2load(grpc, args.seconds, workdir, args.connections)
                        else:
                            rate = load(grpc, keys, args.seconds, args.connections)["decisions_per_sec"]
                        elapsed = time.time() - before[0]
                        cpu = ((cpu_s(proc.pid) - before[1]) / elapsed, (children_cpu_s() - before[2]) / elapsed)
                    finally:
                        proc.terminate()
                        proc.wait(10)
                    rows.setdefault((backend, shape, system), []).append(rate)
                    print(f"rep {rep + 1} {backend} {shape} {system}: {rate:,.0f}/s; CPU: server {cpu[0]:.0%} of a core, "
                          f"load {cpu[1]:.0%}", file=sys.stderr)
    print("| backend | workload | " + " | ".join(f"{s} calls/s" for s in systems) + " | slidegate / limitador |")
    print("|---|---|" + "---|" * (len(systems) + 1))
    for backend in backends:
        for shape in WORKLOADS:
            med = {s: statistics.median(rows[(backend, shape, s)]) for s in systems if (backend, shape, s) in rows}
            cells = " | ".join(f"{med[s]:,.0f}" if s in med else "" for s in systems)
            ratio = ""
            if "limitador" in med:
                pairs = zip(rows[(backend, shape, "slidegate")], rows[(backend, shape, "limitador")])
                ratio = f"{statistics.median(a / b for a, b in pairs):.2f}"
            print(f"| {backend} | {shape} | {cells} | {ratio} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis", action="store_true", help="the Redis backend too")
    ap.add_argument("--wall", action="store_true", help="calls/s instead of instructions per call")
    ap.add_argument("--reps", type=int, default=5, help="--wall: repetitions")
    ap.add_argument("--seconds", type=float, help="the measured load's length (20 s; --wall: 5 s)")
    ap.add_argument("--warmup", type=float, default=10, help="the unmeasured load before it (instructions)")
    ap.add_argument("--h2load", action="store_true", help="--wall: W1 loaded by h2load")
    ap.add_argument("--connections", type=int, default=1, choices=[1, 2, 4],
                    help="--wall: the 64 calls' HTTP/2 connections (slidegate bench and h2load alike)")
    ap.add_argument("--generators", action="store_true", help="the load generators' own instructions per call")
    ap.add_argument("--bench-bin", default=SLIDEGATE, help="--generators: the slidegate whose generator to count")
    ap.add_argument("--keep", help="keep the callgrind files in this directory")
    ap.add_argument("--only", help="these servers alone, e.g. slidegate,limitador")
    args = ap.parse_args()
    args.seconds = args.seconds or (5 if args.wall else 20)
    systems = ["bare", "slidegate"] + (["limitador"] if LIMITADOR else [])
    if args.only:
        systems = [s for s in systems if s in args.only.split(",")]
    backends = ["memory"] + (["redis"] if args.redis else [])
    workdir = args.keep or tempfile.mkdtemp(prefix="slidegate-grpc-floor-")
    os.makedirs(workdir, exist_ok=True)
    redis = Redis() if args.redis else None
    try:
        if redis:
            redis.pin("1")
        if args.generators:
            measure_generators(args, workdir)
        else:
            (measure_wall if args.wall else measure_instructions)(systems, backends, redis, args, workdir)
    finally:
        if redis:
            redis.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
