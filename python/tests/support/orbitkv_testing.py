"""Helpers shared by test modules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

# Appended to a child's code by `spawn_client(vanish=True)`: its Manager connection
# vanishes without a clean close while the process lives on.
_VANISH = """
import os as _os
for _fd in range(3, 1024):
    try:
        _os.close(_fd)
    except OSError:
        pass
"""
_PARK = """
import time as _time
print("READY", flush=True)
_time.sleep(60)
"""


def eventually(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for: {what}")


def spawn_client(code: str, socket: str, *, vanish: bool = False) -> subprocess.Popen[str]:
    """Run `code` (given the socket as argv[1]) in a child Python process; then, with
    `vanish`, drop its connection by closing every fd; then report READY and park.
    Returns once the child is parked: the caller kills it."""
    body = textwrap.dedent(code) + (_VANISH if vanish else "") + _PARK
    p = subprocess.Popen([sys.executable, "-c", body, socket], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "READY", line
    return p
