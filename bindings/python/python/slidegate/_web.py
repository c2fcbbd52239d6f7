"""What the web integrations share: a rate limit as a view declares it, the key of a request
(from a callable, or the client's address behind named trusted proxies), and the 429 answer."""

import functools
import inspect
import ipaddress
import json
from typing import Any, Callable, Iterable, Optional, Union

from ._slidegate import Decision, Limiter

KeyFunc = Callable[[Any], str]

_default: Optional[Limiter] = None


def default_limiter() -> Limiter:
    """The limiter of integrations given none: `set_default_limiter`'s, or one in memory."""
    global _default
    if _default is None:
        _default = Limiter.in_memory()
    return _default


def set_default_limiter(limiter: Limiter) -> None:
    """Makes `limiter` (a `Limiter.redis(...)`, say) the one integrations use when given none."""
    global _default
    _default = limiter


def client_address(peer: Optional[str], forwarded_for: Optional[str], trusted: Iterable[Any]) -> str:
    """The client's address: the peer's, unless the peer is a trusted proxy; then the
    right-most address of `X-Forwarded-For` that is not a trusted proxy. Each proxy appends the
    address it saw, so only the entries appended by trusted proxies are facts: the left-most
    entry is whatever the client wrote, and is never taken on trust."""
    hop = (peer or "").strip()
    hops = [h.strip() for h in (forwarded_for or "").split(",") if h.strip()]
    while _is_trusted(hop, trusted) and hops:
        candidate = hops.pop()
        if _address(candidate) is None:
            break  # a trusted proxy passed on something that is no address: stop at that proxy
        hop = candidate
    return hop or "unknown"


def _address(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_trusted(hop: str, trusted: Iterable[Any]) -> bool:
    address = _address(hop)
    return address is not None and any(address in network for network in trusted)


class RateLimit:
    """One limit as a view or an app declares it: `limit` per `window` for each key, counted
    under `rule` (so that views do not share counts by accident), denied with 429 and
    `message`."""

    def __init__(
        self,
        *,
        limit: int,
        window: Union[str, float],
        key: Union[None, str, KeyFunc] = None,
        message: str = "Too many requests",
        rule: Optional[str] = None,
        cost: int = 1,
        algorithm: str = "sliding_log",
        burst: Optional[int] = None,
        buckets: Optional[int] = None,
        trusted_proxies: Iterable[str] = (),
        limiter: Optional[Limiter] = None,
    ):
        self.key, self.message, self.rule, self.limiter = key, message, rule, limiter
        self.trusted = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]
        self.options = dict(limit=limit, window=window, cost=cost, algorithm=algorithm, burst=burst, buckets=buckets)
        # Refuses bad settings when the view is declared rather than at its first request.
        Limiter.in_memory(max_keys=1).check("declared", **self.options, rule=rule)

    def named(self, rule: str) -> "RateLimit":
        """This limit under `rule` if it has none yet (a decorator names it after its view)."""
        if self.rule is None:
            self.rule = "".join(c if c.isalnum() or c in "_-." else "_" for c in rule)[:64]
        return self

    def key_of(self, request: Any, peer: Optional[str], forwarded_for: Optional[str]) -> str:
        if callable(self.key):
            return self.key(request)
        if isinstance(self.key, str):
            return self.key
        return client_address(peer, forwarded_for, self.trusted)

    def check(self, key: str) -> Decision:
        return (self.limiter or default_limiter()).check(key, **self.options, rule=self.rule)

    async def acheck(self, key: str) -> Decision:
        return await (self.limiter or default_limiter()).acheck(key, **self.options, rule=self.rule)

    def headers(self, decision: Decision) -> dict:
        """The RateLimit fields (and on a denial `Retry-After`), as the Rust crate writes them."""
        return decision.headers(self.rule or "default")

    def denial_body(self, decision: Decision) -> bytes:
        return json.dumps({"error": "rate_limited", "message": self.message,
                           "retry_after": decision.retry_after}).encode()


def view_decorator(options: dict, request_of, addresses, denied, admitted):
    """`@rate_limit(**options)` for a framework's views, sync and async: `request_of(args)` is a
    call's request, `addresses(request)` its peer and `X-Forwarded-For`, `denied(spec,
    decision)` the 429 answer, `admitted(spec, decision, result)` the view's answer with the
    RateLimit fields."""
    spec = RateLimit(**options)

    def decorate(view):
        spec.named(view.__name__)

        def key(args):
            request = request_of(args)
            return spec.key_of(request, *addresses(request))

        if inspect.iscoroutinefunction(view):
            @functools.wraps(view)
            async def limited_async(*args, **kwargs):
                decision = await spec.acheck(key(args))
                if not decision.allowed:
                    return denied(spec, decision)
                return admitted(spec, decision, await view(*args, **kwargs))

            return limited_async

        @functools.wraps(view)
        def limited(*args, **kwargs):
            decision = spec.check(key(args))
            if not decision.allowed:
                return denied(spec, decision)
            return admitted(spec, decision, view(*args, **kwargs))

        return limited

    return decorate
