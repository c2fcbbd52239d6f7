import pytest

from servers import RedisCluster, RedisServer


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def module_server():
    server = RedisServer(module=True)
    yield server
    server.stop()


@pytest.fixture(params=["lua", "module"])
def engine_server(request):
    """A Redis for each engine: the Lua scripts, and slidegate's module."""
    return request.getfixturevalue("redis_server" if request.param == "lua" else "module_server")


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster()
    yield c
    c.stop()
