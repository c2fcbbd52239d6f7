"""The limiter in this process: decisions, answers, and the arguments it refuses."""

import asyncio
from datetime import timedelta

import pytest

import slidegate
from slidegate import InvalidArgument, Limiter


@pytest.fixture
def limiter():
    return Limiter.in_memory()


def test_seven_requests_five_admitted_denials_record_nothing(limiter):
    decisions = [limiter.check("+15550100", limit=5, window="10s") for _ in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0, 0]
    assert all(d.limit == 5 for d in decisions)
    assert decisions[0].retry_after is None
    assert 9.9 < decisions[5].retry_after <= 10.0
    assert 9.9 < decisions[5].reset_after <= 10.0
    assert decisions[5].degraded is None
    assert limiter.inspect("+15550100", limit=5, window="10s").count == 5
    assert not decisions[6] and decisions[0]


def test_cost_and_windows_in_every_form(limiter):
    assert limiter.check("bulk", limit=50, window=timedelta(minutes=1), cost=45).remaining == 5
    denied = limiter.check("bulk", limit=50, window=60, cost=6)
    assert not denied.allowed and denied.remaining == 5, "a denial charges nothing"
    assert limiter.check("bulk", limit=50, window=60.0, cost=5).remaining == 0


def test_every_algorithm_with_its_parameter(limiter):
    gcra = [limiter.check("g", limit=10, window="1s", algorithm="gcra", burst=3).allowed for _ in range(4)]
    assert gcra == [True, True, True, False]
    sw = [limiter.check("s", limit=2, window="1s", algorithm="sliding_window", buckets=4).allowed for _ in range(3)]
    assert sw == [True, True, False]
    fixed = [limiter.check("f", limit=1, window="1h", algorithm="fixed_window").allowed for _ in range(2)]
    assert fixed == [True, False]


def test_check_all_is_all_or_nothing(limiter):
    checks = [dict(key="user:1", limit=10, window="1s"), dict(key="ip:1", limit=1, window="1m", cost=1)]
    first = limiter.check_all(checks)
    assert first.allowed and first.denied_by is None and first.retry_after is None
    second = limiter.check_all(checks)
    assert not second.allowed and second.denied_by == 1 and second.retry_after > 59
    assert [d.allowed for d in second.decisions] == [False, False]
    assert limiter.inspect("user:1", limit=10, window="1s").count == 1, "the denied group charged nothing"
    h = second.headers(["user", "ip"])
    assert h["ratelimit-policy"] == '"user";q=10;w=1, "ip";q=1;w=60'
    assert h["retry-after"] == "60"


def test_reset_and_rules(limiter):
    limiter.check("10.0.0.1", limit=1, window="1m", rule="sms")
    assert not limiter.check("10.0.0.1", limit=1, window="1m", rule="sms").allowed
    assert limiter.check("10.0.0.1", limit=1, window="1m").allowed, "another rule, another count"
    limiter.reset("10.0.0.1", rule="sms")
    assert limiter.check("10.0.0.1", limit=1, window="1m", rule="sms").allowed


def test_headers_are_the_cores():
    limiter = Limiter.in_memory()
    d = limiter.check("login", limit=5, window="60s")
    assert d.headers("login") == {"ratelimit-policy": '"login";q=5;w=60', "ratelimit": '"login";r=4;t=60'}
    for _ in range(4):
        limiter.check("login", limit=5, window="60s")
    denied = limiter.check("login", limit=5, window="60s")
    assert denied.headers()["retry-after"] == "60"


def test_300_concurrent_achecks_on_a_limit_of_100_admit_100(limiter):
    async def main():
        return await asyncio.gather(*[limiter.acheck("burst", limit=100, window="1m") for _ in range(300)])

    assert sum(d.allowed for d in asyncio.run(main())) == 100


@pytest.mark.parametrize(
    "kwargs, bound",
    [
        (dict(limit=0, window="1s"), "limit must be between 1 and 1000000000"),
        (dict(limit=100_001, window="1s"), "limit must be between 1 and 100000"),
        (dict(limit=-1, window="1s"), "limit must be a whole number"),
        (dict(limit=True, window="1s"), "limit must be a whole number"),
        (dict(limit=5, window="0s"), "window must be whole milliseconds between 1ms and 366 days"),
        (dict(limit=5, window=0.0005), "window must be whole milliseconds"),
        (dict(limit=5, window="367d"), "366 days"),
        (dict(limit=5, window="soon"), "is not a duration"),
        (dict(limit=5, window=[1]), "window must be a duration"),
        (dict(limit=5, window="1s", cost=0), "cost must be between 1 and 5"),
        (dict(limit=5, window="1s", cost=6), "cost must be between 1 and 5"),
        (dict(limit=5, window="1s", algorithm="leaky"), "unknown algorithm"),
        (dict(limit=5, window="1s", burst=3), "takes no burst"),
        (dict(limit=5, window="1s", algorithm="sliding_window", buckets=101), "buckets"),
        (dict(limit=5, window="1s", rule="a b"), "may use only letters"),
        (dict(limit=5, window="1s", rule="r" * 65), "rule must be 1 to 64 characters"),
    ],
)
def test_bad_arguments_raise_a_value_error_naming_the_bound(limiter, kwargs, bound):
    with pytest.raises(InvalidArgument, match=bound) as raised:
        limiter.check("k", **kwargs)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, slidegate.Error)


def test_bad_keys_and_groups(limiter):
    with pytest.raises(ValueError, match="key must not be empty"):
        limiter.check("", limit=1, window="1s")
    with pytest.raises(ValueError, match="the maximum is 512"):
        limiter.check("k" * (slidegate.MAX_KEY_LEN + 1), limit=1, window="1s")
    one = dict(key="a", limit=1, window="1s")
    with pytest.raises(ValueError, match="check_all needs 1 to 16 checks, got 17"):
        limiter.check_all([one] * 17)
    with pytest.raises(ValueError, match="more than once"):
        limiter.check_all([one, one])
    with pytest.raises(ValueError, match="needs \"limit\""):
        limiter.check_all([dict(key="a", window="1s")])
    with pytest.raises(ValueError, match="max_keys must be at least 1"):
        Limiter.in_memory(max_keys=0)
    with pytest.raises(ValueError, match="one name per check"):
        limiter.check_all([one]).headers(["a", "b"])


def test_charge_records_past_the_limit_and_refund_gives_back(limiter):
    assert limiter.check("tpm", limit=1000, window="1m", cost=600).allowed
    charged = limiter.charge("tpm", limit=1000, window="1m", cost=700)
    assert (charged.recorded, charged.clamped) == (700, False)
    assert not charged.decision.allowed and charged.decision.retry_after > 0, "over its limit now"
    assert not limiter.check("tpm", limit=1000, window="1m")
    refunded = limiter.refund("tpm", limit=1000, window="1m", cost=400)
    assert refunded.refunded == 400
    assert refunded.decision.allowed and refunded.decision.remaining == 100
    clamped = limiter.charge("tpm", limit=1000, window="1m", cost=1000)
    assert (clamped.recorded, clamped.clamped) == (1000, False)
    clamped = limiter.charge("tpm", limit=1000, window="1m", cost=1000)
    assert (clamped.recorded, clamped.clamped) == (100, True), "at twice the limit"
    assert limiter.inspect("tpm", limit=1000, window="1m").count == 2000
    assert limiter.refund("tpm", limit=1000, window="1m", cost=1000).refunded == 1000
    assert limiter.refund("tpm", limit=1000, window="1m", cost=1000).refunded == 1000
    assert limiter.refund("tpm", limit=1000, window="1m", cost=1).refunded == 0, "never below nothing"


def test_charge_and_refund_refuse_what_a_check_refuses(limiter):
    for cost in (0, 1001, -1, 2.5, "5"):
        with pytest.raises(InvalidArgument):
            limiter.charge("k", limit=1000, window="1m", cost=cost)
        with pytest.raises(InvalidArgument):
            limiter.refund("k", limit=1000, window="1m", cost=cost)
    with pytest.raises(TypeError):
        limiter.charge("k", limit=1000, window="1m")
    with pytest.raises(InvalidArgument):
        limiter.charge("", limit=10, window="1m", cost=1)
    assert limiter.inspect("k", limit=1000, window="1m").count == 0, "nothing recorded"
