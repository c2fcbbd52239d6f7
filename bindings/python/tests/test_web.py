"""The integrations through their frameworks' test clients: Flask and Django views (sync and
async), the FastAPI dependency and the Starlette middleware; 429 with Retry-After and the
RateLimit fields; keys from a callable or the client's address behind trusted proxies."""

import asyncio

import pytest

from slidegate import InvalidArgument, Limiter
from slidegate._web import RateLimit, client_address


def test_the_client_is_the_right_most_address_no_trusted_proxy_appended():
    trusted = RateLimit(limit=1, window="1s", trusted_proxies=["10.0.0.0/8", "::1"]).trusted
    assert client_address("203.0.113.9", "1.1.1.1", trusted) == "203.0.113.9", "an untrusted peer is the client"
    assert client_address("10.0.0.2", "6.6.6.6, 198.51.100.7", trusted) == "198.51.100.7"
    assert client_address("10.0.0.2", "6.6.6.6, 198.51.100.7, 10.1.1.1", trusted) == "198.51.100.7"
    assert client_address("::1", None, trusted) == "::1"
    assert client_address("10.0.0.2", "forged, 10.0.0.3", trusted) == "10.0.0.3"
    assert client_address("10.0.0.2", "6.6.6.6", []) == "10.0.0.2", "no trusted proxy: the header is ignored"


def test_a_bad_limit_is_refused_where_it_is_declared():
    with pytest.raises(InvalidArgument, match="limit must be between 1"):
        RateLimit(limit=0, window="1s")
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        RateLimit(limit=1, window="1s", trusted_proxies=["proxy.internal"])


def assert_denied(status, headers, body_text, message):
    assert status == 429
    assert int(headers["Retry-After"]) >= 59
    assert headers["RateLimit-Policy"].endswith(";q=2;w=60")
    assert ";r=0;t=" in headers["RateLimit"]
    assert message in body_text


# Flask

flask = pytest.importorskip("flask")
from slidegate.flask import rate_limit as flask_rate_limit  # noqa: E402


def flask_app(limiter):
    app = flask.Flask(__name__)

    @app.post("/sms")
    @flask_rate_limit(limit=2, window="60s", message="Too many SMS", limiter=limiter,
                      trusted_proxies=["10.0.0.0/8"])
    def sms():
        return {"sent": True}

    @app.get("/async")
    @flask_rate_limit(key=lambda r: r.args["user"], limit=2, window="60s", message="slow down", limiter=limiter)
    async def by_user():
        return "ok"

    return app


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_flask_sync_view_behind_a_proxy(backend, redis_server):
    limiter = Limiter.in_memory() if backend == "memory" else Limiter.redis(redis_server.url, timeout=2)
    limiter.reset("198.51.100.7", rule="sms")
    client = flask_app(limiter).test_client()
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    answers = [client.post("/sms", environ_base=proxy, headers={"X-Forwarded-For": f"6.6.6.{i}, 198.51.100.7"})
               for i in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429], "a forged left-most entry changes nothing"
    assert answers[0].headers["RateLimit"] == '"sms";r=1;t=60'
    assert_denied(answers[2].status_code, answers[2].headers, answers[2].get_data(as_text=True), "Too many SMS")
    other = client.post("/sms", environ_base=proxy, headers={"X-Forwarded-For": "198.51.100.8"})
    assert other.status_code == 200


def test_flask_async_view_keyed_by_a_callable():
    client = flask_app(Limiter.in_memory()).test_client()
    codes = [client.get("/async?user=ann").status_code for _ in range(3)] + [client.get("/async?user=bob").status_code]
    assert codes == [200, 200, 429, 200]
    denied = client.get("/async?user=ann")
    assert_denied(denied.status_code, denied.headers, denied.get_data(as_text=True), "slow down")


# Django

django = pytest.importorskip("django")
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"], DEBUG=False, SECRET_KEY="test")
    django.setup()

from django.http import JsonResponse  # noqa: E402
from django.test import AsyncClient, Client  # noqa: E402
from django.urls import path  # noqa: E402

from slidegate.django import rate_limit as django_rate_limit  # noqa: E402

django_limiter = Limiter.in_memory()


@django_rate_limit(limit=2, window="60s", message="Too many SMS", limiter=django_limiter)
def django_sms(request):
    return JsonResponse({"sent": True})


@django_rate_limit(key=lambda r: r.GET["user"], limit=2, window="60s", message="slow down", limiter=django_limiter)
async def django_async(request):
    return JsonResponse({"ok": True})


urlpatterns = [path("sms", django_sms), path("async", django_async)]


def test_django_sync_view():
    client = Client(REMOTE_ADDR="192.0.2.1")
    answers = [client.post("/sms") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[1]["RateLimit"] == '"django_sms";r=0;t=60'
    assert_denied(429, answers[2].headers, answers[2].content.decode(), "Too many SMS")
    assert Client(REMOTE_ADDR="192.0.2.2").post("/sms").status_code == 200


def test_django_async_view():
    async def main():
        client = AsyncClient()
        return [await client.get("/async", {"user": u}) for u in ["ann", "ann", "ann", "bob"]]

    answers = asyncio.run(main())
    assert [a.status_code for a in answers] == [200, 200, 429, 200]
    assert_denied(429, answers[2].headers, answers[2].content.decode(), "slow down")


# FastAPI and Starlette

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slidegate.starlette import RateLimit as Dependency  # noqa: E402
from slidegate.starlette import RateLimitMiddleware  # noqa: E402


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_fastapi_dependency(backend, redis_server):
    limiter = Limiter.in_memory() if backend == "memory" else Limiter.redis(redis_server.url, timeout=2)
    app = fastapi.FastAPI()
    sms = Dependency(limit=2, window="60s", message="Too many SMS", limiter=limiter, rule=f"sms-{backend}",
                     key=lambda r: r.headers["x-user"])
    limiter.reset("ann", rule=f"sms-{backend}")

    @app.post("/sms", dependencies=[fastapi.Depends(sms)])
    async def send():
        return {"sent": True}

    client = TestClient(app)
    answers = [client.post("/sms", headers={"x-user": "ann"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["ratelimit"] == f'"sms-{backend}";r=1;t=60'
    assert_denied(429, answers[2].headers, answers[2].text, "Too many SMS")


def test_starlette_middleware_on_the_client_address():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("hi"))])
    app.add_middleware(RateLimitMiddleware, limit=2, window="60s", message="Too many requests",
                       limiter=Limiter.in_memory())
    ann, bob = TestClient(app, client=("192.0.2.1", 5000)), TestClient(app, client=("192.0.2.2", 5000))
    answers = [ann.get("/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["ratelimit"] == '"app";r=1;t=60'
    assert_denied(429, answers[2].headers, answers[2].text, "Too many requests")
    assert bob.get("/").status_code == 200
