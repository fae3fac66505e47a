"""Shared fixtures: real Manager processes started through `python -m orbitkv serve`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orbitkv.launch import serve_command


class ManagerProcess:
    def __init__(self, socket: Path, proc: subprocess.Popen[bytes]) -> None:
        self.socket = str(socket)
        self.proc = proc

    def client(self, **kw: object) -> object:
        from orbitkv import _native

        return _native.Client(self.socket, **kw)

    def stats(self) -> dict[str, object]:
        with self.client() as c:  # type: ignore[attr-defined]
            return c.stats()  # type: ignore[no-any-return]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


def start_manager(tmp: Path, *args: str) -> ManagerProcess:
    sock = tmp / "manager.sock"
    proc = subprocess.Popen(serve_command(sock, *args))
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"Manager exited early with code {proc.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                return ManagerProcess(sock, proc)
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("Manager did not come up")
    except BaseException:
        proc.kill()  # never leak a Manager when start-up fails
        proc.wait()
        raise


@pytest.fixture
def manager_factory(tmp_path: Path) -> Iterator[Callable[..., ManagerProcess]]:
    started: list[ManagerProcess] = []

    def make(*args: str) -> ManagerProcess:
        d = tmp_path / f"m{len(started)}"
        d.mkdir(mode=0o700)  # the Manager refuses a socket directory others may write
        if "--dram-size" not in args:
            args = ("--dram-size", "32MiB", *args)  # the arena is populated at start: keep tests small
        m = start_manager(d, *args)
        started.append(m)
        return m

    yield make
    for m in started:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


@pytest.fixture
def manager(manager_factory: Callable[..., ManagerProcess]) -> ManagerProcess:
    return manager_factory("--dram-size", "64MiB", "--segment-size", "16MiB", "--enable-fault-injection")


def native_available() -> bool:
    try:
        import orbitkv._native  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if native_available() or os.environ.get("ORBITKV_REQUIRE_NATIVE") != "1":
        return
    raise pytest.UsageError("ORBITKV_REQUIRE_NATIVE=1 but orbitkv._native is not importable")
