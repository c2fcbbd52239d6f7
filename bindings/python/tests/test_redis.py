"""The limiter on real redis-server processes: each engine (the Lua scripts, slidegate's
module), a Cluster, exactness under concurrency, the GIL and the event loop while Redis is
slow, and the failure policy when Redis is gone."""

import asyncio
import threading
import time
import uuid

import pytest

from servers import RedisServer, wait_for
from threads import admitted_from_threads
from slidegate import BackendUnavailable, InvalidArgument, Limiter


def fresh() -> str:
    return uuid.uuid4().hex


def test_the_engine_is_detected_and_decides(engine_server, request):
    limiter = Limiter.redis(engine_server.url, timeout=2)
    key = fresh()
    assert [limiter.check(key, limit=5, window="10s").allowed for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.backend == "redis"
    assert limiter.engine == request.node.callspec.params["engine_server"]
    assert limiter.inspect(key, limit=5, window="10s").count == 5
    limiter.reset(key)
    assert limiter.inspect(key, limit=5, window="10s").count == 0


def test_300_concurrent_achecks_on_a_limit_of_100_admit_exactly_100(engine_server):
    limiter = Limiter.redis(engine_server.url, timeout=5)
    key = fresh()

    async def main():
        return await asyncio.gather(*[limiter.acheck(key, limit=100, window="1m") for _ in range(300)])

    decisions = asyncio.run(main())
    assert sum(d.allowed for d in decisions) == 100
    assert limiter.inspect(key, limit=100, window="1m").count == 100


def test_8_threads_on_a_limit_of_100_admit_exactly_100(engine_server):
    limiter = Limiter.redis(engine_server.url, timeout=5)
    key = fresh()
    assert admitted_from_threads(lambda: limiter.check(key, limit=100, window="1m").allowed) == 100


def test_check_all_on_redis_is_all_or_nothing(engine_server):
    limiter = Limiter.redis(engine_server.url, timeout=2)
    user, ip = fresh(), fresh()
    checks = [dict(key=user, limit=3, window="1m"), dict(key=ip, limit=1, window="1m", algorithm="fixed_window")]
    assert limiter.check_all(checks).allowed

    async def again():
        return await limiter.acheck_all(checks)

    denied = asyncio.run(again())
    assert not denied.allowed and denied.denied_by == 1
    assert limiter.inspect(user, limit=3, window="1m").count == 1


def slow_redis(server: RedisServer, seconds: float) -> threading.Thread:
    """Holds `server` busy for `seconds` (DEBUG SLEEP from another connection)."""
    sleeper = threading.Thread(target=lambda: server.client().execute_command("DEBUG", "SLEEP", seconds))
    sleeper.start()
    time.sleep(0.05)
    return sleeper


def test_a_sync_check_waiting_on_redis_releases_the_gil(redis_server):
    limiter = Limiter.redis(redis_server.url, timeout=5)
    limiter.check(fresh(), limit=1, window="1s")  # scripts loaded, connection up
    sleeper = slow_redis(redis_server, 0.5)
    waiting = threading.Thread(target=lambda: limiter.check(fresh(), limit=1, window="1s"))
    waiting.start()
    time.sleep(0.05)
    spins = 0
    while waiting.is_alive():
        spins += 1
    waiting.join()
    sleeper.join()
    # Holding the GIL, the waiting thread would leave this loop a few turns per switch interval.
    assert spins > 100_000, spins


def test_an_acheck_waiting_on_redis_leaves_the_event_loop_running(redis_server):
    limiter = Limiter.redis(redis_server.url, timeout=5)
    limiter.check(fresh(), limit=1, window="1s")

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        sleeper = slow_redis(redis_server, 0.4)
        d = await limiter.acheck(fresh(), limit=1, window="1s")
        task.cancel()
        sleeper.join()
        return d, ticks

    d, ticks = asyncio.run(main())
    assert d.allowed
    assert ticks >= 10, ticks


def test_redis_gone_raises_or_the_failure_policy_answers():
    server = RedisServer()
    strict = Limiter.redis(server.url, timeout=0.2)
    closed = Limiter.redis(server.url, timeout=0.2, failure_policy="fail_closed")
    local = Limiter.redis(server.url, timeout=0.2, failure_policy="local", local_share=0.5)
    server.stop()
    with pytest.raises(BackendUnavailable):
        strict.check("k", limit=10, window="1m")
    d = closed.check("k", limit=10, window="1m")
    assert not d.allowed and d.degraded == "fail_closed"
    degraded = [local.check("k", limit=10, window="1m") for _ in range(6)]
    assert [d.allowed for d in degraded] == [True] * 5 + [False], "half of the limit, locally"
    assert all(d.degraded == "local" for d in degraded)


def test_what_was_admitted_locally_is_written_back_into_a_redis_back_empty():
    server = RedisServer()
    local = Limiter.redis(server.url, timeout=0.05, failure_policy="local", local_share=0.5)
    server.stop()
    assert [local.check("wb", limit=10, window="1m").allowed for _ in range(6)] == [True] * 5 + [False]
    back = RedisServer(port=server.port)
    try:
        def written_back() -> bool:
            keys = back.client().keys("*wb*")
            return bool(keys) and back.client().zcard(keys[0]) == 5
        wait_for(written_back, "the five local admissions written back")
        decided = [local.check("wb", limit=10, window="1m") for _ in range(6)]
        assert [d.degraded for d in decided] == [None] * 6, "decided by Redis again"
        assert [d.allowed for d in decided] == [True] * 5 + [False], "the limit less what was written back"
    finally:
        back.stop()


def test_with_local_share_auto_limiters_count_each_other_and_share_the_limit_while_redis_is_away():
    server = RedisServer()
    fleet = [Limiter.redis(server.url, timeout=0.05, failure_policy="local", local_share="auto",
                           local_share_fallback=0.9) for _ in range(2)]
    try:
        wait_for(lambda: all(f.fleet_instances == 2 for f in fleet), "each limiter counting two")
        server.stop()
        admitted = [sum(f.check("shared", limit=10, window="1m").allowed for _ in range(10)) for f in fleet]
        assert admitted == [5, 5], "the limit ÷ the two instances, each"
        assert all(f.fleet_instances == 2 for f in fleet), "the last count stands through the outage"
    finally:
        server.stop()


def test_redis_options_are_checked():
    with pytest.raises(InvalidArgument, match="timeout must be more than 0 and at most 60 s"):
        Limiter.redis("redis://127.0.0.1:1", timeout=0)
    with pytest.raises(InvalidArgument, match="needs local_share"):
        Limiter.redis("redis://127.0.0.1:1", failure_policy="local")
    with pytest.raises(InvalidArgument, match="needs local_share_fallback"):
        Limiter.redis("redis://127.0.0.1:1", failure_policy="local", local_share="auto")
    with pytest.raises(InvalidArgument, match="applies to local_share=\"auto\" only"):
        Limiter.redis("redis://127.0.0.1:1", failure_policy="local", local_share=0.5, local_share_fallback=0.5)
    with pytest.raises(InvalidArgument, match="must be a number"):
        Limiter.redis("redis://127.0.0.1:1", failure_policy="local", local_share="half")
    with pytest.raises(InvalidArgument, match="failure_policy must be"):
        Limiter.redis("redis://127.0.0.1:1", failure_policy="retry")
    with pytest.raises(InvalidArgument, match="unknown Redis engine"):
        Limiter.redis("redis://127.0.0.1:1", engine="python")
    with pytest.raises(InvalidArgument, match="takes one URL, got 2"):
        Limiter.redis(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
    with pytest.raises(InvalidArgument, match="1 to 64 URLs, got 65"):
        Limiter.redis(["redis://127.0.0.1:1"] * 65, cluster=True)


def test_the_module_is_used_when_loaded_and_the_keys_are_the_services(module_server):
    limiter = Limiter.redis(module_server.url, timeout=2)
    limiter.check("192.168.1.100", limit=5, window="60s", rule="sms")
    assert limiter.engine == "module"
    assert module_server.client().exists("slidegate:sms:{192.168.1.100}")


def test_on_a_cluster(cluster):
    limiter = Limiter.redis(cluster.urls, cluster=True, timeout=5, cluster_slot_check=True)
    assert limiter.backend == "redis_cluster"
    key = fresh()

    async def main():
        return await asyncio.gather(*[limiter.acheck(key, limit=100, window="1m") for _ in range(300)])

    assert sum(d.allowed for d in asyncio.run(main())) == 100
    user = fresh()
    tagged = [dict(key=f"{{{user}}}:sms", limit=2, window="1m"), dict(key=f"{{{user}}}:login", limit=1, window="1m")]
    assert limiter.check_all(tagged).allowed
    assert limiter.check_all(tagged).denied_by == 1
    with pytest.raises(InvalidArgument, match="different Redis Cluster slots"):
        limiter.check_all([dict(key="a", limit=1, window="1s"), dict(key="b", limit=1, window="1s")])


def test_tokens_per_minute_from_64_tasks_sum_exactly(engine_server):
    """Each task checks an estimate of 1,000 and settles what it used: the key then holds
    exactly the tokens recorded, and once over its budget the user is denied."""
    limiter = Limiter.redis(engine_server.url, timeout=5)
    key, options = fresh(), dict(limit=20_000, window="1m")

    async def task(i):
        if not (await limiter.acheck(key, cost=1000, **options)).allowed:
            return 0
        used = 400 + (i * 733) % 1_900
        if used > 1000:
            charged = await limiter.acharge(key, cost=used - 1000, **options)
            assert charged.clamped == (charged.recorded < used - 1000), "clamped only at twice the limit"
            return 1000 + charged.recorded
        assert (await limiter.arefund(key, cost=1000 - used, **options)).refunded == 1000 - used
        return used

    async def main():
        return await asyncio.gather(*[task(i) for i in range(64)])

    spent = sum(asyncio.run(main()))
    assert limiter.inspect(key, **options).count == spent
    assert spent >= 20_000 and not limiter.check(key, **options).allowed, "over budget: denied"
    given_back = limiter.refund(key, cost=20_000, **options).refunded
    given_back += limiter.refund(key, cost=20_000, **options).refunded
    assert given_back == spent
    assert limiter.check(key, **options).allowed, "all given back"

