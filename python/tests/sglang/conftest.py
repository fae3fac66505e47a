"""Fixtures of the OrbitKV SGLang adapter suite (see sglang_env.py, run.sh)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_manager import manager_in_short_dir
from sglang_env import PINNED_SGLANG, UNAVAILABLE, ManagerProcess


def pytest_report_header(config: pytest.Config) -> list[str]:
    if UNAVAILABLE:
        return [f"orbitkv SGLang suite SKIPPED: {UNAVAILABLE}"]
    return [f"orbitkv SGLang suite: sglang=={PINNED_SGLANG} from {sys.executable}"]


@pytest.fixture
def orbit_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    with manager_in_short_dir(Path(tmp_path_factory.mktemp("mgr", numbered=True)), "okv-sgl") as mgr:
        yield mgr
