"""Start a Manager (`python -m orbitkv serve`) as a child process.

The one place that knows the command line and how to tell that the Manager is
up: the demo, the benchmarks and the tests start their Managers through it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any


class ManagerStartError(RuntimeError):
    """The Manager exited, or did not answer in time, while starting."""


def serve_command(
    socket: str | os.PathLike[str], *flags: str, metrics: str = "off", log_level: str = "warn"
) -> list[str]:
    """The argv of `orbitkv serve` on `socket`, metrics and log level set, then `flags`."""
    return [
        sys.executable,
        "-m",
        "orbitkv",
        "serve",
        "--socket",
        os.fspath(socket),
        "--metrics-addr",
        metrics,
        "--log-level",
        log_level,
        *flags,
    ]


def wait_until_serving(proc: subprocess.Popen[bytes], socket: str | os.PathLike[str], timeout_s: float) -> None:
    """Return once the Manager on `socket` accepts a client; raise
    `ManagerStartError` if `proc` exits first or `timeout_s` passes (it is then
    terminated)."""
    from orbitkv import _native

    path = os.fspath(socket)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ManagerStartError(f"the Manager exited with code {proc.returncode}")
        try:
            _native.Client(path, map_arena=False).close()
            return
        except _native.ManagerUnavailable:
            time.sleep(0.05)
    proc.terminate()
    raise ManagerStartError(f"the Manager did not accept a client within {timeout_s:g} s")


def start_serve(
    socket: str | os.PathLike[str],
    *flags: str,
    timeout_s: float = 30.0,
    metrics: str = "off",
    log_level: str = "warn",
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start `orbitkv serve` on `socket` with `flags` (`popen`: extra
    `subprocess.Popen` arguments, e.g. `stdout=`) and wait until it serves."""
    proc: subprocess.Popen[bytes] = subprocess.Popen(
        serve_command(socket, *flags, metrics=metrics, log_level=log_level), **popen
    )
    wait_until_serving(proc, socket, timeout_s)
    return proc


def stop_process(proc: subprocess.Popen[Any] | None, timeout_s: float = 30.0) -> None:
    """SIGTERM `proc` (a no-op when None or already exited) and reap it; SIGKILL it if it
    has not exited within `timeout_s`."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
