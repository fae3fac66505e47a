"""Fixtures of the OrbitKV SGLang adapter suite (see sglang_env.py, run.sh)."""

from __future__ import annotations

import sys

import pytest
from engine_env import orbit_manager_fixture
from sglang_env import PINNED_SGLANG, UNAVAILABLE


def pytest_report_header(config: pytest.Config) -> list[str]:
    if UNAVAILABLE:
        return [f"orbitkv SGLang suite SKIPPED: {UNAVAILABLE}"]
    return [f"orbitkv SGLang suite: sglang=={PINNED_SGLANG} from {sys.executable}"]


orbit_manager = orbit_manager_fixture("okv-sgl")
