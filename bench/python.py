#!/usr/bin/env python3
"""The Python package beside what Python users run instead, on one Redis, in one run (issue 34).

Systems, each deciding "limit per window per key" on the same redis-server:
  slidegate     this package: Limiter.redis(...).check / await acheck (the Rust core, its own
                pipelined connection, the GIL released while waiting)
  redis-py      the classic sorted-set script (bench/baselines/sliding_log_classic.lua) by
                redis-py's Script (EVALSHA), redis.asyncio for the async runs
  limits-mw     limits' MovingWindowRateLimiter on its RedisStorage (async: limits.aio, redis-py)
  limits-fw     limits' FixedWindowRateLimiter, the same storages
Modes: sync from 1 and 8 threads, async with 64 tasks. Throughput: `--decisions` decisions over
1,000 keys, 1,000 per 60 s each (all admitted). Client CPU per decision: this process's CPU time
(every thread, tokio's included) over the decisions. Exactness: 300 concurrent attempts (8
threads, 64 tasks) on one key with a limit of 100: an exact limiter admits 100.

    target/python-bench/bin/pip install ./bindings/python redis limits   # a release build
    target/python-bench/bin/python bench/python.py [--decisions 4000]

Redis, the systems and the modes are interleaved within one run; the machine is shared, so read
the ratios to redis-py in the same run.
"""
import argparse, asyncio, os, random, socket, subprocess, sys, tempfile, threading, time, uuid

import redis
import redis.asyncio as aredis
from limits import parse
from limits.aio import storage as astorage
from limits.aio import strategies as astrategies
from limits import storage, strategies

import slidegate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSIC = open(os.path.join(ROOT, "bench", "baselines", "sliding_log_classic.lua")).read()
KEYS, LIMIT, WINDOW = 1000, 1000, 60


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Systems:
    """Each system's sync and async `decide(key, limit) -> bool` over one Redis."""

    def __init__(self, url):
        self.url = url
        self.sg = slidegate.Limiter.redis(url, timeout=5)
        self.r = redis.Redis.from_url(url)
        self.script = self.r.register_script(CLASSIC)
        item = lambda limit: parse(f"{limit}/{WINDOW} second")
        self.items = {}
        s = storage.RedisStorage(url)
        self.mw, self.fw = strategies.MovingWindowRateLimiter(s), strategies.FixedWindowRateLimiter(s)
        self.item = lambda limit: self.items.setdefault(limit, item(limit))

    def sync(self, name):
        if name == "slidegate":
            return lambda key, limit: self.sg.check(key, limit=limit, window=WINDOW).allowed
        if name == "redis-py":
            return lambda key, limit: self.script(keys=[key], args=[WINDOW * 1000, limit, uuid.uuid4().hex]) == 1
        strategy = self.mw if name == "limits-mw" else self.fw
        return lambda key, limit: strategy.hit(self.item(limit), key)

    def asynchronous(self, name):
        """An async decide, built inside the running loop (the async clients bind to it)."""
        if name == "slidegate":
            async def decide(key, limit):
                return (await self.sg.acheck(key, limit=limit, window=WINDOW)).allowed
            return decide
        if name == "redis-py":
            script = aredis.Redis.from_url(self.url).register_script(CLASSIC)
            async def decide(key, limit):
                return await script(keys=[key], args=[WINDOW * 1000, limit, uuid.uuid4().hex]) == 1
            return decide
        s = astorage.RedisStorage(self.url.replace("redis://", "async+redis://"), implementation="redispy")
        strategy = (astrategies.MovingWindowRateLimiter if name == "limits-mw" else astrategies.FixedWindowRateLimiter)(s)
        async def decide(key, limit):
            return await strategy.hit(self.item(limit), key)
        return decide


def run_threads(decide, keys, limit, threads):
    """Decides every key of `keys` from `threads` threads; (admitted, seconds, cpu seconds)."""
    chunks = [keys[i::threads] for i in range(threads)]
    admitted = [0] * threads
    def work(i):
        admitted[i] = sum(decide(k, limit) for k in chunks[i])
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    wall, cpu = time.perf_counter(), time.process_time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(admitted), time.perf_counter() - wall, time.process_time() - cpu


def run_tasks(systems, name, keys, limit, tasks):
    async def main():
        decide = systems.asynchronous(name)
        await decide(f"warm:{uuid.uuid4().hex}", limit)
        queue = iter(keys)
        admitted = 0
        async def worker():
            nonlocal admitted
            for k in queue:
                ok = await decide(k, limit)
                admitted += ok  # after the await: `admitted += await …` would read admitted before it
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*[worker() for _ in range(tasks)])
        return admitted, time.perf_counter() - wall, time.process_time() - cpu
    return asyncio.run(main())


MODES = [("sync, 1 thread", 1, None), ("sync, 8 threads", 8, None), ("async, 64 tasks", None, 64)]
NAMES = ["slidegate", "redis-py", "limits-mw", "limits-fw"]


def measure(systems, name, mode, decisions):
    _, threads, tasks = mode
    prefix = f"{name}:{uuid.uuid4().hex}:"
    keys = [f"{prefix}{random.randrange(KEYS)}" for _ in range(decisions)]
    hot = [f"{prefix}hot"] * 300
    if tasks:
        _, wall, cpu = run_tasks(systems, name, keys, LIMIT, tasks)
        exact, _, _ = run_tasks(systems, name, hot, 100, tasks)
    else:
        systems.sync(name)(f"warm:{uuid.uuid4().hex}", LIMIT)
        _, wall, cpu = run_threads(systems.sync(name), keys, LIMIT, threads)
        exact, _, _ = run_threads(systems.sync(name), hot, 100, threads)
    return decisions / wall, cpu / decisions * 1e6, exact


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=4000)
    args = ap.parse_args()
    port, workdir = free_port(), tempfile.mkdtemp(prefix="slidegate-bench-py-")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        systems = Systems(f"redis://127.0.0.1:{port}")
        print(f"slidegate engine: {systems.sg.engine}; {args.decisions} decisions per cell; Python {sys.version.split()[0]}")
        print("| mode | system | decisions/s | × redis-py | client CPU µs/decision | × redis-py | admitted of 300 on a limit of 100 |")
        print("|---|---|---|---|---|---|---|")
        for mode in MODES:
            rows = {name: measure(systems, name, mode, args.decisions) for name in NAMES}
            base = rows["redis-py"]
            for name, (rate, cpu, exact) in rows.items():
                print(f"| {mode[0]} | {name} | {rate:,.0f} | {rate / base[0]:.2f} | {cpu:.0f} | {cpu / base[1]:.2f} | {exact} |")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
