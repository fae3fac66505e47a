"""Fixtures and hooks of the OrbitKV vLLM adapter suite (see vllm_env.py, run.sh)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_env import PINNED_VLLM, UNAVAILABLE, ManagerProcess


def pytest_report_header(config: pytest.Config) -> list[str]:
    if UNAVAILABLE:
        return [f"orbitkv vLLM suite SKIPPED: {UNAVAILABLE}"]
    import vllm

    return [f"orbitkv vLLM suite: vllm=={vllm.__version__} (pin {PINNED_VLLM}) from {sys.executable}"]


@pytest.fixture
def orbit_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    # Unix socket paths are limited to ~107 bytes: keep the directory short.
    d = Path(tmp_path_factory.mktemp("mgr", numbered=True))
    short = Path("/tmp") / f"okv-{os.getpid()}-{d.name}"
    short.mkdir(mode=0o700, exist_ok=True)  # the Manager refuses a socket directory others may write
    mgr = ManagerProcess(short / "m.sock", d / "manager.log", fault_injection=True)
    try:
        yield mgr
    finally:
        mgr.stop()
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    from vllm_harness import write_tiny_model

    return write_tiny_model(tmp_path / "tiny-llama")
