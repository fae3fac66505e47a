"""Fixtures and hooks of the OrbitKV vLLM adapter suite (see vllm_env.py, run.sh)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_manager import manager_in_short_dir
from vllm_env import PINNED_VLLM, UNAVAILABLE, ManagerProcess


def pytest_report_header(config: pytest.Config) -> list[str]:
    if UNAVAILABLE:
        return [f"orbitkv vLLM suite SKIPPED: {UNAVAILABLE}"]
    import vllm

    return [f"orbitkv vLLM suite: vllm=={vllm.__version__} (pin {PINNED_VLLM}) from {sys.executable}"]


@pytest.fixture
def orbit_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    with manager_in_short_dir(Path(tmp_path_factory.mktemp("mgr", numbered=True)), "okv") as mgr:
        yield mgr


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    from vllm_harness import write_tiny_model

    return write_tiny_model(tmp_path / "tiny-llama")
