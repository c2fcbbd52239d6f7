"""`@rate_limit` for Flask views, sync and async: 429 with `Retry-After` and the RateLimit
fields when the limit is reached, the RateLimit fields on every admitted answer too.

    from slidegate.flask import rate_limit

    @app.post("/sms")
    @rate_limit(limit=5, window="60s", message="Too many SMS")
    def send_sms(): ...
"""

import functools
import inspect

import flask

from ._web import RateLimit, default_limiter, set_default_limiter

__all__ = ["rate_limit", "default_limiter", "set_default_limiter"]


def rate_limit(**options):
    """Limits a view: `limit` per `window` per key (`key`: a callable of the request, a
    constant, or by default the client's address behind `trusted_proxies`). The other
    arguments are `slidegate._web.RateLimit`'s."""
    spec = RateLimit(**options)

    def decorate(view):
        spec.named(view.__name__)

        def key():
            r = flask.request
            return spec.key_of(r, r.remote_addr, r.headers.get("X-Forwarded-For"))

        def answer(decision, result):
            if not decision.allowed:
                return flask.Response(spec.denial_body(decision), 429, spec.headers(decision),
                                      mimetype="application/json")
            response = flask.make_response(result)
            response.headers.update(spec.headers(decision))
            return response

        if inspect.iscoroutinefunction(view):
            @functools.wraps(view)
            async def limited_async(*args, **kwargs):
                decision = await spec.acheck(key())
                return answer(decision, await view(*args, **kwargs) if decision.allowed else None)

            return limited_async

        @functools.wraps(view)
        def limited(*args, **kwargs):
            decision = spec.check(key())
            return answer(decision, view(*args, **kwargs) if decision.allowed else None)

        return limited

    return decorate
