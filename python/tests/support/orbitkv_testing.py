"""Helpers shared by test modules."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for: {what}")
