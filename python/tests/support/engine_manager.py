"""A real `python -m orbitkv serve` process on a private socket, for the engine suites
(vLLM, SGLang), which run in their own venvs with the wheel installed there."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orbitkv.launch import serve_command


def stop_all_threads(pid: int) -> None:
    """SIGSTOP `pid` and wait until every thread is stopped (kill() only queues it): a
    Manager alive, its sockets open, answering nothing."""
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + 10
    while not all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt" for t in tasks.iterdir()):
        assert time.monotonic() < deadline, "the Manager did not stop"
        time.sleep(0.01)


class ManagerProcess:
    """A real `python -m orbitkv serve` process on a private socket."""

    def __init__(
        self,
        socket_path: Path,
        log_path: Path,
        fault_injection: bool = True,
        dram_size: str = "64MiB",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.socket_path = socket_path
        self.log_path = log_path
        args = serve_command(socket_path, "--dram-size", dram_size, "--segment-size", "16MiB")
        if fault_injection:
            args.append("--enable-fault-injection")
        args.extend(extra_args)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(socket_path.parent), env=env
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20.0) -> None:
        from orbitkv import _native

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Manager exited with {self.proc.returncode}: {self.log()}")
            if self.socket_path.exists():
                try:
                    with _native.Client(str(self.socket_path), timeout_ms=2000) as c:
                        c.stats()
                    return
                except Exception as exc:
                    last = exc
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Manager did not become ready ({last!r}): {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def client(self):  # type: ignore[no-untyped-def]
        from orbitkv import _native

        return _native.Client(str(self.socket_path), timeout_ms=5000)

    def stats(self) -> dict:
        with self.client() as c:
            return dict(c.stats())

    def settled_stats(self, timeout: float = 10.0, **expected: int) -> dict:
        """Stats once each named gauge has its expected value. The adapters release
        leases with `release(lease, wait=False)` (no reply), so the Manager applies a
        release a moment after the adapter sent it, on that adapter's session, while
        these stats come through another one. Fails naming the values last seen."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if all(st[k] == v for k, v in expected.items()):
                return st
            if time.monotonic() > deadline:
                seen = {k: st[k] for k in expected}
                raise AssertionError(f"Manager stats never reached {expected} within {timeout} s: {seen}")
            time.sleep(0.01)

    def quiet_counter(self, key: str, quiet: float = 0.5, timeout: float = 30.0) -> int:
        """Counter `key` once it stopped changing for `quiet` seconds (a background
        writer, such as the SSD write-behind, has caught up)."""
        last, since = self.stats()[key], time.monotonic()
        deadline = time.monotonic() + timeout
        while time.monotonic() - since < quiet:
            assert time.monotonic() < deadline, f"{key} still moving after {timeout} s"
            time.sleep(0.05)
            now = self.stats()[key]
            if now != last:
                last, since = now, time.monotonic()
        return int(last)

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye (a crashed Manager)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextmanager
def manager_in_short_dir(
    log_dir: Path,
    prefix: str,
    fault_injection: bool = True,
    extra_args: tuple[str, ...] = (),
    dram_size: str = "64MiB",
) -> Iterator[ManagerProcess]:
    """A Manager whose socket lives in a short private directory under /tmp (Unix socket
    paths are limited to ~107 bytes; the Manager refuses a socket directory others may
    write), its log in `log_dir`; stopped and the directory removed on exit."""
    short = Path("/tmp") / f"{prefix}-{os.getpid()}-{log_dir.name}"
    short.mkdir(mode=0o700, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    mgr = ManagerProcess(
        short / "m.sock",
        log_dir / "manager.log",
        fault_injection=fault_injection,
        dram_size=dram_size,
        extra_args=extra_args,
    )
    try:
        yield mgr
    finally:
        mgr.stop()
        shutil.rmtree(short, ignore_errors=True)
