"""What every adapter's Manager session needs, whatever the engine.

- `native()`: `orbitkv._native`, imported on first use (contract O4: importing an adapter
  starts nothing native);
- `is_error(exc, name)`: whether `exc` is the native error class `name`, and
  `connection_lost(exc)`: whether it means the connection is gone (reconnect);
- `ReconnectBackoff`: after a failed connect, calls fail fast until the back-off
  expires, so an unreachable Manager costs one connect attempt per back-off (0.5 s,
  doubling to 30 s), not one per engine step. Each failure is logged once, saying that
  requests miss the external cache meanwhile. `not_connected(msg)`: the error a
  session raises meanwhile (not a lost connection).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from types import ModuleType

_native: ModuleType | None = None

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


def native() -> ModuleType:
    """Import `orbitkv._native` on first use."""
    global _native
    if _native is None:
        _native = importlib.import_module("orbitkv._native")
    return _native


def is_error(exc: BaseException, name: str) -> bool:
    """True when `exc` is the native error class `name` (or a subclass)."""
    cls = getattr(native(), name, None)
    return cls is not None and isinstance(exc, cls)


_NotConnected: type[Exception] | None = None


def not_connected(message: str) -> Exception:
    """A `ManagerUnavailable` raised while a session has no connection (a back-off runs,
    or a connection is being made in the background). It says nothing about any
    connection, so `connection_lost` is False for it: a caller must not drop the session's
    client for it (which could be the one just made by the background attempt)."""
    global _NotConnected
    if _NotConnected is None:
        _NotConnected = type("NotConnected", (native().ManagerUnavailable,), {"__module__": __name__})
    return _NotConnected(message)


def is_not_connected(exc: BaseException) -> bool:
    """True when `exc` came from `not_connected` (the session has no connection yet)."""
    return _NotConnected is not None and isinstance(exc, _NotConnected)


def connection_lost(exc: BaseException) -> bool:
    """True when `exc` says the Manager connection is gone (the Manager died, restarted
    or broke the protocol): the session must be dropped and the next call reconnects."""
    if is_not_connected(exc):
        return False
    return is_error(exc, "ManagerUnavailable") or is_error(exc, "ProtocolError")


class ReconnectBackoff:
    """When the next connection attempt may be made. Not thread-safe: the caller holds
    its session lock (or calls from one thread)."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._clock = clock
        self._retry_at = 0.0
        self._delay = 0.0

    @property
    def delay(self) -> float:
        """The current back-off in seconds (0 after a success)."""
        return self._delay

    def wait_left(self) -> float:
        """Seconds until an attempt is allowed (0: try now)."""
        return max(0.0, self._retry_at - self._clock())

    def failed(self, exc: BaseException) -> None:
        """A connection attempt failed: double the back-off (0.5 s to 30 s) and log it."""
        self._delay = min(max(2 * self._delay, FIRST_BACKOFF_S), MAX_BACKOFF_S)
        self._retry_at = self._clock() + self._delay
        # Visible, once per attempt: requests miss the external cache meanwhile.
        self._logger.warning(
            "orbitkv: cannot reach the Manager (%s); requests miss the external cache, next attempt in %.1fs",
            exc,
            self._delay,
        )

    def succeeded(self) -> None:
        self._delay = 0.0
        self._retry_at = 0.0
