"""FastAPI and Starlette: `RateLimit`, a FastAPI dependency, and `RateLimitMiddleware`, an ASGI
middleware for a whole app; both answer 429 with `Retry-After` and the RateLimit fields, and
put the RateLimit fields on every admitted answer. Decisions are `acheck`s: the event loop
never waits on Redis.

    from fastapi import Depends, FastAPI
    from slidegate.starlette import RateLimit, RateLimitMiddleware

    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limit=1000, window="1m")

    @app.post("/sms", dependencies=[Depends(RateLimit(limit=5, window="60s", message="Too many SMS"))])
    async def send_sms(): ...
"""

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from . import _web
from ._web import default_limiter, set_default_limiter

__all__ = ["RateLimit", "RateLimitMiddleware", "default_limiter", "set_default_limiter"]


def _key(spec: _web.RateLimit, request: Request) -> str:
    peer = request.client.host if request.client else None
    return spec.key_of(request, peer, request.headers.get("x-forwarded-for"))


class RateLimit(_web.RateLimit):
    """A FastAPI dependency: `Depends(RateLimit(limit=5, window="60s"))` on a route or a
    router. Named `rule` after the route's path unless given one."""

    async def __call__(self, request: Request, response: Response) -> None:
        if self.rule is None:
            self.named(request.scope.get("route").path if request.scope.get("route") else request.url.path)
        decision = await self.acheck(_key(self, request))
        if not decision.allowed:
            raise HTTPException(429, detail=self.message, headers=self.headers(decision))
        response.headers.update(self.headers(decision))


class RateLimitMiddleware:
    """Limits every HTTP request of an ASGI app (`rule` defaults to `"app"`); takes
    `slidegate._web.RateLimit`'s arguments."""

    def __init__(self, app, **options):
        self.app = app
        self.spec = _web.RateLimit(**options).named("app")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        decision = await self.spec.acheck(_key(self.spec, Request(scope)))
        headers = [(k.encode(), v.encode()) for k, v in self.spec.headers(decision).items()]
        if not decision.allowed:
            body = self.spec.denial_body(decision)
            start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 429, "headers": start + headers})
            return await send({"type": "http.response.body", "body": body})

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
