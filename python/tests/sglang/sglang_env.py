"""Environment of the OrbitKV SGLang adapter suite (runs inside the pinned SGLang venv).

Run it with `python/tests/sglang/run.sh` (creates/reuses the venv, installs the native
wheel, runs pytest with -rs). When the venv cannot be built, run.sh exports
ORBITKV_SGLANG_UNAVAILABLE with the reason and every test here is skipped with it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PINNED_SGLANG = "0.5.21"
REPO_PYTHON = Path(__file__).resolve().parents[2]
REPO_PKG = REPO_PYTHON / "orbitkv"


def _unavailable_reason() -> str | None:
    reason = os.environ.get("ORBITKV_SGLANG_UNAVAILABLE")
    if reason:
        return f"sglang=={PINNED_SGLANG} venv unavailable on this platform: {reason}"
    try:
        found = version("sglang")
    except PackageNotFoundError:
        return (
            f"sglang=={PINNED_SGLANG} is not installed for {sys.executable}; "
            "run python/tests/sglang/run.sh, which builds the pinned venv"
        )
    if found != PINNED_SGLANG:
        return f"found sglang {found}, the adapter is pinned to {PINNED_SGLANG}"
    return None


UNAVAILABLE = _unavailable_reason()


def skip_module_if_unavailable() -> None:
    """Call first in every test module, before anything imports SGLang."""
    if UNAVAILABLE:
        pytest.skip(UNAVAILABLE, allow_module_level=True)


def _use_working_tree_adapter() -> None:
    """Test this checkout's `orbitkv.sglang` (and the pure-Python helpers it uses) whatever
    `orbitkv` wheel is installed; the compiled `_native` stays the installed one."""
    if str(REPO_PYTHON) not in sys.path:
        sys.path.append(str(REPO_PYTHON))
    import orbitkv

    for sub in ("sglang", "kvcopy"):
        pkg_dir = REPO_PKG / sub
        name = f"orbitkv.{sub}"
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        spec = importlib.util.spec_from_file_location(
            name, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(orbitkv, sub, module)


_use_working_tree_adapter()


class ManagerProcess:
    """A real `python -m orbitkv serve` process on a private socket."""

    def __init__(self, socket_path: Path, log_path: Path, *, fault_injection: bool = True) -> None:
        self.socket_path = socket_path
        self.log_path = log_path
        args = [
            sys.executable,
            "-m",
            "orbitkv",
            "serve",
            "--socket",
            str(socket_path),
            "--dram-size",
            "64MiB",
            "--segment-size",
            "16MiB",
            "--metrics-addr",
            "off",
            "--log-level",
            "warn",
        ]
        if fault_injection:
            args.append("--enable-fault-injection")
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
