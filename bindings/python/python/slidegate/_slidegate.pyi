"""Type stubs of the Rust extension (bindings/python/src)."""

from datetime import timedelta
from typing import Awaitable, Literal, Optional, Sequence, TypedDict, Union

from typing_extensions import NotRequired, Unpack

Window = Union[str, int, float, timedelta]
Algorithm = Literal["sliding_log", "sliding_window", "fixed_window", "gcra", "token_bucket"]

class LimitOptions(TypedDict):
    """What `inspect` takes beside the key: the limit and how it counts."""

    limit: int
    window: Window
    algorithm: NotRequired[Algorithm]
    rule: NotRequired[Optional[str]]
    burst: NotRequired[Optional[int]]
    buckets: NotRequired[Optional[int]]

class CheckOptions(LimitOptions):
    """What `check` and `acheck` take beside the key."""

    cost: NotRequired[Optional[int]]

class SettleOptions(LimitOptions):
    """What `charge`, `refund` and their awaitables take beside the key."""

    cost: int

class CheckItem(CheckOptions):
    """One check of `check_all`."""

    key: str

MAX_KEY_LEN: int
MAX_CHECKS: int
MAX_LIMIT: int
MAX_LOG_LIMIT: int
MAX_RULE_LEN: int

class Decision:
    @property
    def allowed(self) -> bool: ...
    @property
    def limit(self) -> int: ...
    @property
    def remaining(self) -> int: ...
    @property
    def reset_after(self) -> float: ...
    @property
    def retry_after(self) -> Optional[float]: ...
    @property
    def next_permit_after(self) -> float: ...
    @property
    def degraded(self) -> Optional[Literal["fail_open", "fail_closed", "local"]]: ...
    def headers(self, name: str = "default") -> dict[str, str]: ...
    def __bool__(self) -> bool: ...

class MultiDecision:
    @property
    def allowed(self) -> bool: ...
    @property
    def decisions(self) -> list[Decision]: ...
    @property
    def denied_by(self) -> Optional[int]: ...
    @property
    def retry_after(self) -> Optional[float]: ...
    def headers(self, names: Sequence[str]) -> dict[str, str]: ...
    def __bool__(self) -> bool: ...

class Charged:
    @property
    def decision(self) -> Decision: ...
    @property
    def recorded(self) -> int: ...
    @property
    def clamped(self) -> bool: ...

class Refunded:
    @property
    def decision(self) -> Decision: ...
    @property
    def refunded(self) -> int: ...

class KeyState:
    @property
    def count(self) -> int: ...
    @property
    def oldest_ms(self) -> Optional[int]: ...
    @property
    def reset_after(self) -> float: ...

class Limiter:
    @staticmethod
    def in_memory(max_keys: int = 1_000_000) -> Limiter: ...
    @staticmethod
    def redis(
        url: Union[str, Sequence[str]],
        *,
        cluster: bool = False,
        sentinel_service: Optional[str] = None,
        prefix: str = "slidegate",
        engine: Literal["auto", "lua", "module"] = "auto",
        timeout: float = 0.05,
        failure_policy: Optional[Literal["fail_open", "fail_closed", "local"]] = None,
        local_share: Union[float, Literal["auto"], None] = None,
        local_share_fallback: Optional[float] = None,
        near_cache: int = 0,
        cluster_slot_check: bool = False,
    ) -> Limiter: ...
    @property
    def backend(self) -> Literal["memory", "redis", "redis_cluster", "redis_sentinel"]: ...
    @property
    def engine(self) -> Literal["memory", "auto", "lua", "module"]: ...
    @property
    def fleet_instances(self) -> Optional[int]: ...
    def check(self, key: str, **options: Unpack[CheckOptions]) -> Decision: ...
    def acheck(self, key: str, **options: Unpack[CheckOptions]) -> Awaitable[Decision]: ...
    def check_all(self, checks: Sequence[CheckItem]) -> MultiDecision: ...
    def acheck_all(self, checks: Sequence[CheckItem]) -> Awaitable[MultiDecision]: ...
    def charge(self, key: str, **options: Unpack[SettleOptions]) -> Charged: ...
    def acharge(self, key: str, **options: Unpack[SettleOptions]) -> Awaitable[Charged]: ...
    def refund(self, key: str, **options: Unpack[SettleOptions]) -> Refunded: ...
    def arefund(self, key: str, **options: Unpack[SettleOptions]) -> Awaitable[Refunded]: ...
    def inspect(self, key: str, **options: Unpack[LimitOptions]) -> KeyState: ...
    def reset(self, key: str, *, rule: Optional[str] = None) -> None: ...
