"""One limit with the service: `check(key, rule="sms")` from Python and `POST /v1/check
{"rule": "sms"}` through the spawned `slidegate serve` count in one log on one Redis."""

import json
import urllib.request

import pytest

from servers import RedisServer, Slidegate, wait_for
from slidegate import Limiter

RULES = """
[[rules]]
name = "sms"
limit = 5
window = "60s"
"""


@pytest.fixture(params=["lua", "module"])
def shared(request, tmp_path):
    server = request.getfixturevalue("redis_server" if request.param == "lua" else "module_server")
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    service = Slidegate("--config", str(rules), "--redis", server.url)
    yield server, service
    service.stop()


def test_python_and_the_service_count_in_one_log(shared):
    server, service = shared
    limiter = Limiter.redis(server.url, timeout=2)
    ip = "192.168.1.100"
    limiter.reset(ip, rule="sms")
    python = [limiter.check(ip, limit=5, window="60s", rule="sms") for _ in range(3)]
    assert [d.remaining for d in python] == [4, 3, 2]
    http = [service.post("/v1/check", {"rule": "sms", "key": ip}) for _ in range(3)]
    assert [a["allowed"] for a in http] == [True, True, False]
    assert [a["remaining"] for a in http] == [1, 0, 0]
    last = limiter.check(ip, limit=5, window="60s", rule="sms")
    assert not last.allowed and last.retry_after > 0
    assert limiter.inspect(ip, limit=5, window="60s", rule="sms").count == 5
    # One log under the service's own key name (a sorted set for the scripts, the module's type for it).
    assert limiter.engine == "module" or server.client().zcard("slidegate:sms:{192.168.1.100}") == 5


def test_python_limiters_and_the_service_count_one_fleet(tmp_path):
    server = RedisServer()
    rules = tmp_path / "fleet.toml"
    rules.write_text(f"""
[backend]
redis = "{server.url}"
failure_policy = "local"
local_share = "auto"
local_share_fallback = 0.5
{RULES}""")
    service = Slidegate("--config", str(rules))
    limiter = Limiter.redis(server.url, failure_policy="local", local_share="auto", local_share_fallback=0.5)
    try:
        def service_counts() -> int:
            with urllib.request.urlopen(f"{service.base}/readyz", timeout=5) as r:
                return json.loads(r.read())["fleet"]["instances"]
        wait_for(lambda: limiter.fleet_instances == 2, "the Python limiter counting itself and the service")
        wait_for(lambda: service_counts() == 2, "the service counting itself and the Python limiter")
    finally:
        service.stop()
        server.stop()
