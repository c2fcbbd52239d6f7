"""`@rate_limit` for Flask views, sync and async: 429 with `Retry-After` and the RateLimit
fields when the limit is reached, the RateLimit fields on every admitted answer too.

    from slidegate.flask import rate_limit

    @app.post("/sms")
    @rate_limit(limit=5, window="60s", message="Too many SMS")
    def send_sms(): ...
"""

import flask

from ._web import default_limiter, set_default_limiter, view_decorator

__all__ = ["rate_limit", "default_limiter", "set_default_limiter"]


def _denied(spec, decision):
    return flask.Response(spec.denial_body(decision), 429, spec.headers(decision), mimetype="application/json")


def _admitted(spec, decision, result):
    response = flask.make_response(result)
    response.headers.update(spec.headers(decision))
    return response


def rate_limit(**options):
    """Limits a view: `limit` per `window` per key (`key`: a callable of the request, a
    constant, or by default the client's address behind `trusted_proxies`); the other
    arguments are `slidegate._web.RateLimit`'s."""
    addresses = lambda r: (r.remote_addr, r.headers.get("X-Forwarded-For"))  # noqa: E731
    return view_decorator(options, lambda args: flask.request, addresses, _denied, _admitted)
