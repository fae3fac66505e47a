"""What the vLLM and SGLang adapter suites share in their environment modules
(`vllm_env.py`, `sglang_env.py`) and conftests: skipping a module with the reason a pin is
unavailable, the Manager fixture, and loading this checkout's adapter packages."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_manager import ManagerProcess, manager_in_short_dir
from working_tree import use_working_tree

__all__ = [
    "ManagerProcess",
    "adapter_from_working_tree",
    "not_installed",
    "orbit_manager_fixture",
    "skip_module",
    "venv_unavailable",
]


def skip_module(unavailable: str | None) -> None:
    """Skip the calling test module with `unavailable` (the pin's reason), if any."""
    if unavailable:
        pytest.skip(unavailable, allow_module_level=True)


def venv_unavailable(package: str, pin: str) -> str | None:
    """Why run.sh could not provide the `package` venv of `pin` (it exports that reason as
    ORBITKV_<PACKAGE>_UNAVAILABLE), or None."""
    reason = os.environ.get(f"ORBITKV_{package.upper()}_UNAVAILABLE")
    return f"{package}=={pin} venv unavailable on this platform: {reason}" if reason else None


def not_installed(package: str, pin: str) -> str:
    """The reason to skip when `package` is not installed for this interpreter."""
    return (
        f"{package}=={pin} is not installed for {sys.executable}; "
        f"run python/tests/{package}/run.sh, which builds the pinned venv"
    )


def adapter_from_working_tree(adapter: str) -> None:
    """This checkout's `orbitkv.<adapter>` and the layers it builds on, whatever wheel is installed."""
    use_working_tree("engine", "kvcopy", adapter)


def orbit_manager_fixture(socket_prefix: str) -> Callable[..., Any]:
    """A function-scoped `orbit_manager` fixture: a real Manager with its socket in a short
    private directory named after `socket_prefix`, stopped after the test."""

    @pytest.fixture
    def orbit_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
        with manager_in_short_dir(Path(tmp_path_factory.mktemp("mgr", numbered=True)), socket_prefix) as mgr:
            yield mgr

    return orbit_manager
