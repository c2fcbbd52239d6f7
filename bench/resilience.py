#!/usr/bin/env python3
"""Resilience and scale figures (issue: production resilience), measured in one run:

1. Hot-key attack: one key, limit 100 per 10 s, 64 in flight, `slidegate bench` straight at
   Redis without and with the near-cache, beside the classic sorted-set script under `redis-benchmark -P 16`
   (Redis' ceiling for one decision per command). Reports decisions/s and Redis commands per
   decision (all commands Redis executed, from INFO commandstats, over decisions made).
2. 10,000 uniform keys, 64 in flight: one Redis vs a 3-master Redis Cluster (no replicas).
3. What one request waits while Redis stalls (DEBUG SLEEP), circuit closed vs open: from the
   fault-injection test's own measurement (`cargo test --test faults -- breaker`).

Placement: Redis (or the cluster) on CPU 1, the load generator on CPU 0.
Medians of --reps interleaved repetitions. Loopback only; every server is ours and stopped.

    cargo build --release -p slidegate-server --features bench && python3 bench/resilience.py [--reps 3]
"""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_ceiling import CLASSIC, SLIDEGATE, Redis, free_port, redis_benchmark  # noqa: E402


def commands(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "commandstats"], capture_output=True, text=True).stdout
    total = 0
    for line in out.splitlines():
        if line.startswith("cmdstat_") and not line.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_cluster",
                                                                "cmdstat_command", "cmdstat_flushall", "cmdstat_script")):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def bench(target, keys, window, seconds, near_cache=0):
    cmd = ["taskset", "-c", os.environ.get("LOAD_CPUS", "0"), SLIDEGATE, "bench", "--target", target, "--keys", str(keys), "--concurrency", "64",
           "--duration", f"{seconds}s", "--limit", "100", "--window", window, "--near-cache", str(near_cache), "--json"]
    v = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout)
    if v["errors"]:
        raise SystemExit(f"{target}: {v['errors']} errors")
    return v


class Cluster:
    def __init__(self, masters):
        self.dir = tempfile.mkdtemp(prefix="slidegate-cluster-")
        self.ports, self.procs = [], []
        for i in range(masters):
            port, bus = free_port(), free_port()
            d = os.path.join(self.dir, str(i))
            os.makedirs(d)
            self.procs.append(subprocess.Popen(
                ["taskset", "-c", os.environ.get("CLUSTER_CPUS", "1"), "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", d, "--cluster-enabled", "yes", "--cluster-port", str(bus),
                 "--cluster-config-file", "nodes.conf"], stdout=subprocess.DEVNULL))
            self.ports.append(port)
        for port in self.ports:
            for _ in range(200):
                if self.cli(port, "PING") == "PONG":
                    break
                time.sleep(0.02)
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports], "--cluster-yes"],
                       capture_output=True, check=True)
        for _ in range(300):
            if all("cluster_state:ok" in self.cli(p, "CLUSTER", "INFO") for p in self.ports):
                return
            time.sleep(0.1)
        raise SystemExit("cluster did not form")

    @staticmethod
    def cli(port, *args):
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True).stdout.strip()

    def target(self):
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def flush(self):
        for p in self.ports:
            self.cli(p, "FLUSHALL")
            self.cli(p, "CONFIG", "RESETSTAT")

    def usec_per_call(self):
        """EVALSHA time over calls, summed over the masters."""
        usec = calls = 0
        for p in self.ports:
            for line in self.cli(p, "INFO", "commandstats").splitlines():
                if line.startswith("cmdstat_evalsha:"):
                    f = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
                    usec, calls = usec + float(f["usec"]), calls + int(f["calls"])
        return usec / max(calls, 1)

    def stop(self):
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    r, cluster = Redis(), Cluster(3)
    rows = {}
    try:
        sha = r.cli("SCRIPT", "LOAD", open(CLASSIC).read())
        for rep in range(args.reps):
            res = {}
            r.fresh("1")
            res["ceiling"] = redis_benchmark(r, sha, "W1", 64, 16, 600_000)["rps"]
            for name, near in (("plain", 0), ("near_cache", 100_000)):
                r.fresh("1")
                before = commands(r.port)
                v = bench(f"redis://127.0.0.1:{r.port}", 1, "10s", args.seconds, near)
                decided = v["allowed"] + v["denied"]
                res[name] = v["decisions_per_sec"]
                res[name + "_cmds"] = (commands(r.port) - before) / decided
            r.fresh("1")
            res["one_redis_10k"] = bench(f"redis://127.0.0.1:{r.port}", 10_000, "60s", args.seconds)["decisions_per_sec"]
            res["one_redis_usec"] = r.usec_per_call()
            cluster.flush()
            res["cluster_10k"] = bench(cluster.target(), 10_000, "60s", args.seconds)["decisions_per_sec"]
            res["cluster_usec"] = cluster.usec_per_call()
            for k, v in res.items():
                rows.setdefault(k, []).append(v)
            print(f"rep {rep + 1}: " + json.dumps(res), file=sys.stderr)
    finally:
        r.stop()
        cluster.stop()
    m = {k: statistics.median(v) for k, v in rows.items()}
    print("| hot key (W1), 64 in flight | decisions/s | × ceiling | Redis commands per decision |")
    print("|---|---|---|---|")
    print(f"| classic script, redis-benchmark -P 16 (ceiling) | {m['ceiling']:,.0f} | 1.00 | 1 |")
    print(f"| slidegate, no near-cache | {m['plain']:,.0f} | {m['plain'] / m['ceiling']:.2f} | {m['plain_cmds']:.3f} |")
    print(f"| slidegate, near-cache | {m['near_cache']:,.0f} | **{m['near_cache'] / m['ceiling']:.1f}** | {m['near_cache_cmds']:.6f} |")
    print()
    print("| 10,000 keys (W2), 64 in flight | decisions/s | ratio | Redis µs per decision |")
    print("|---|---|---|---|")
    print(f"| one Redis | {m['one_redis_10k']:,.0f} | 1.00 | {m['one_redis_usec']:.2f} |")
    print(f"| 3-master Redis Cluster | {m['cluster_10k']:,.0f} | {m['cluster_10k'] / m['one_redis_10k']:.2f} | {m['cluster_usec']:.2f} |")


if __name__ == "__main__":
    main()
