"""`@rate_limit` for Django views, sync and async: 429 with `Retry-After` and the RateLimit
fields when the limit is reached, the RateLimit fields on every admitted answer too.

    from slidegate.django import rate_limit

    @rate_limit(limit=5, window="60s", message="Too many SMS")
    def send_sms(request): ...
"""

from django.http import HttpResponse

from ._web import default_limiter, set_default_limiter, view_decorator

__all__ = ["rate_limit", "default_limiter", "set_default_limiter"]


def _admitted(spec, decision, response):
    for name, value in spec.headers(decision).items():
        response[name] = value
    return response


def _denied(spec, decision):
    body = HttpResponse(spec.denial_body(decision), status=429, content_type="application/json")
    return _admitted(spec, decision, body)


def rate_limit(**options):
    """Limits a view (its first argument the request): `limit` per `window` per key (`key`: a
    callable of the request, a constant, or by default the client's address behind
    `trusted_proxies`); the other arguments are `slidegate._web.RateLimit`'s."""
    addresses = lambda r: (r.META.get("REMOTE_ADDR"), r.META.get("HTTP_X_FORWARDED_FOR"))  # noqa: E731
    return view_decorator(options, lambda args: args[0], addresses, _denied, _admitted)
