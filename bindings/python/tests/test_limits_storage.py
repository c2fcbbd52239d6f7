"""The `limits` storage through limits' own strategies: the scheme registered, the moving window
exact under threads on memory and Redis, and the strategies it does not serve refused."""

import pytest

from threads import admitted_from_threads

limits = pytest.importorskip("limits")
import slidegate.limits  # noqa: E402,F401  (registers the schemes)
from limits import parse, storage, strategies  # noqa: E402


@pytest.fixture(params=["memory", "redis"])
def moving(request):
    if request.param == "memory":
        return strategies.MovingWindowRateLimiter(storage.storage_from_string("slidegate+memory://"))
    uri = request.getfixturevalue("redis_server").url.replace("redis://", "slidegate+redis://")
    return strategies.MovingWindowRateLimiter(storage.storage_from_string(uri, timeout=2))


def test_the_moving_window_admits_exactly_its_limit_from_8_threads(moving):
    item = parse("100/minute")
    moving.clear(item, "hot")
    assert admitted_from_threads(lambda: moving.hit(item, "hot")) == 100
    assert not moving.test(item, "hot")
    assert moving.get_window_stats(item, "hot").remaining == 0
    moving.clear(item, "hot")
    assert moving.hit(item, "hot", cost=100) and not moving.hit(item, "hot")


def test_the_fixed_window_strategies_are_refused_not_approximated():
    fixed = strategies.FixedWindowRateLimiter(storage.storage_from_string("slidegate+memory://"))
    with pytest.raises(NotImplementedError, match="moving-window strategy only"):
        fixed.hit(parse("5/minute"), "k")
