"""Fixtures and hooks of the OrbitKV vLLM adapter suite (see vllm_env.py, run.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from engine_env import orbit_manager_fixture
from vllm_env import PINNED_VLLM, UNAVAILABLE


def pytest_report_header(config: pytest.Config) -> list[str]:
    if UNAVAILABLE:
        return [f"orbitkv vLLM suite SKIPPED: {UNAVAILABLE}"]
    import vllm

    return [f"orbitkv vLLM suite: vllm=={vllm.__version__} (pin {PINNED_VLLM}) from {sys.executable}"]


orbit_manager = orbit_manager_fixture("okv")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    from vllm_harness import write_tiny_model

    return write_tiny_model(tmp_path / "tiny-llama")
