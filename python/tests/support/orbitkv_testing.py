"""Helpers shared by test modules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence

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


def eventually(pred: Callable[[], bool], what: str, timeout: float = 10.0, poll: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for: {what}")


def assert_imports_nothing_heavy(code: str, heavy: Sequence[str]) -> None:
    """Run `code` in a fresh interpreter: after it, none of the modules `heavy` is imported."""
    code += f"import sys\nheavy = [m for m in {tuple(heavy)!r} if m in sys.modules]\nprint(heavy)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


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
