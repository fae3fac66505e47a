"""Fixtures of the OrbitKV SGLang adapter suite (see sglang_env.py, run.sh)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglang_env import PINNED_SGLANG, UNAVAILABLE, ManagerProcess


def pytest_report_header(config: pytest.Config) -> list[str]:
    if UNAVAILABLE:
        return [f"orbitkv SGLang suite SKIPPED: {UNAVAILABLE}"]
    return [f"orbitkv SGLang suite: sglang=={PINNED_SGLANG} from {sys.executable}"]


@pytest.fixture
def orbit_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    d = Path(tmp_path_factory.mktemp("mgr", numbered=True))
    short = Path("/tmp") / f"okv-sgl-{os.getpid()}-{d.name}"
    short.mkdir(mode=0o700, exist_ok=True)
    mgr = ManagerProcess(short / "m.sock", d / "manager.log")
    try:
        yield mgr
    finally:
        mgr.stop()
        shutil.rmtree(short, ignore_errors=True)
