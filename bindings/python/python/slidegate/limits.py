"""A storage for the `limits` package (and so for slowapi and Flask-Limiter): importing this
module registers the schemes `slidegate+redis://…` and `slidegate+memory://`, so switching is
one storage URI. The moving-window strategy is served by slidegate's sliding log: one atomic
decision per hit on Redis' clock, `cost` checked before anything is written, a denial recording
nothing. The fixed-window strategies need a bare counter incremented past its limit, which
slidegate does not keep: they raise `NotImplementedError` (use `limits`' own Redis storage, or
slidegate's `algorithm="fixed_window"` directly).

    import slidegate.limits  # registers the schemes
    from limits import parse, storage, strategies

    moving = strategies.MovingWindowRateLimiter(storage.storage_from_string("slidegate+redis://127.0.0.1:6379"))
    moving.hit(parse("5/minute"), "192.168.1.100")
"""

import time

from limits.storage import MovingWindowSupport, Storage

from ._errors import Error
from ._slidegate import Limiter

__all__ = ["SlidegateStorage"]

_FIXED_WINDOW = "slidegate's limits storage serves the moving-window strategy only"


class SlidegateStorage(Storage, MovingWindowSupport):
    """`limits`' storage on a slidegate `Limiter`: `slidegate+redis://host:port[/db]` (options
    as `Limiter.redis`'s keyword arguments) or `slidegate+memory://`."""

    STORAGE_SCHEME = ["slidegate+redis", "slidegate+rediss", "slidegate+memory"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options):
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        scheme, rest = uri.split("+", 1)[1].split("://", 1)
        self.limiter = Limiter.in_memory() if scheme == "memory" else Limiter.redis(f"{scheme}://{rest}", **options)

    @property
    def base_exceptions(self):
        return Error

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return self.limiter.check(key, limit=limit, window=expiry, cost=amount).allowed

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple:
        state = self.limiter.inspect(key, limit=limit, window=expiry)
        oldest = state.oldest_ms / 1000 if state.oldest_ms is not None else time.time()
        return oldest, state.count

    def clear(self, key: str) -> None:
        self.limiter.reset(key)

    def check(self) -> bool:
        try:
            self.limiter.inspect("slidegate-limits-storage-check", limit=1, window=1)
            return True
        except Error:
            return False

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        raise NotImplementedError(_FIXED_WINDOW)

    def get(self, key: str) -> int:
        raise NotImplementedError(_FIXED_WINDOW)

    def get_expiry(self, key: str) -> float:
        raise NotImplementedError(_FIXED_WINDOW)

    def reset(self) -> None:
        raise NotImplementedError("slidegate's limits storage clears one key at a time (clear)")
