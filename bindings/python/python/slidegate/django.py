"""`@rate_limit` for Django views, sync and async: 429 with `Retry-After` and the RateLimit
fields when the limit is reached, the RateLimit fields on every admitted answer too.

    from slidegate.django import rate_limit

    @rate_limit(limit=5, window="60s", message="Too many SMS")
    def send_sms(request): ...
"""

import functools
import inspect

from django.http import HttpResponse

from ._web import RateLimit, default_limiter, set_default_limiter

__all__ = ["rate_limit", "default_limiter", "set_default_limiter"]


def rate_limit(**options):
    """Limits a view: `limit` per `window` per key (`key`: a callable of the request, a
    constant, or by default the client's address behind `trusted_proxies`). The other
    arguments are `slidegate._web.RateLimit`'s."""
    spec = RateLimit(**options)

    def decorate(view):
        spec.named(view.__name__)

        def key(request):
            meta = request.META
            return spec.key_of(request, meta.get("REMOTE_ADDR"), meta.get("HTTP_X_FORWARDED_FOR"))

        def denied(decision):
            response = HttpResponse(spec.denial_body(decision), status=429, content_type="application/json")
            return with_headers(response, decision)

        def with_headers(response, decision):
            for name, value in spec.headers(decision).items():
                response[name] = value
            return response

        if inspect.iscoroutinefunction(view):
            @functools.wraps(view)
            async def limited_async(request, *args, **kwargs):
                decision = await spec.acheck(key(request))
                if not decision.allowed:
                    return denied(decision)
                return with_headers(await view(request, *args, **kwargs), decision)

            return limited_async

        @functools.wraps(view)
        def limited(request, *args, **kwargs):
            decision = spec.check(key(request))
            if not decision.allowed:
                return denied(decision)
            return with_headers(view(request, *args, **kwargs), decision)

        return limited

    return decorate
