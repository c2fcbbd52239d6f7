"""Exact distributed rate limiting, decided by slidegate's Rust core.

``Limiter.in_memory()`` decides in this process; ``Limiter.redis(url)`` decides on Redis, so the
same limit holds across every process that shares it (and with the ``slidegate`` service, for
checks under the same ``rule``). ``check`` waits without the GIL; ``acheck`` is its asyncio
form. Integrations: ``slidegate.flask``, ``slidegate.django``, ``slidegate.starlette``.
"""

from ._errors import BackendError, BackendUnavailable, Error, InvalidArgument
from ._slidegate import (
    MAX_CHECKS,
    MAX_KEY_LEN,
    MAX_LIMIT,
    MAX_LOG_LIMIT,
    MAX_RULE_LEN,
    Charged,
    Decision,
    KeyState,
    Limiter,
    MultiDecision,
    Refunded,
)

__all__ = [
    "MAX_CHECKS",
    "MAX_KEY_LEN",
    "MAX_LIMIT",
    "MAX_LOG_LIMIT",
    "MAX_RULE_LEN",
    "BackendError",
    "BackendUnavailable",
    "Charged",
    "Decision",
    "Error",
    "InvalidArgument",
    "KeyState",
    "Limiter",
    "MultiDecision",
    "Refunded",
]
