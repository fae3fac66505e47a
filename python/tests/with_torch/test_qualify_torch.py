"""`orbitkv qualify`'s copy-engine item with torch present: on CPU pages here, through a
real Manager (the same code measures `cuda` on a GPU host: python/tests/gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

pytestmark = pytest.mark.native

SMALL = ["--dram-size", "64MiB", "--copy-bytes", "8MiB", "--block-size", "256KiB", "--reps", "1"]


def qualify(tmp_path: Path, *args: str) -> dict[str, dict[str, Any]]:
    r = subprocess.run(
        [sys.executable, "-m", "orbitkv", "qualify", "--json", *SMALL, "--socket", str(tmp_path / "r" / "s"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stderr
    return {i["name"]: i for i in json.loads(r.stdout)["items"]}


def test_the_copy_engine_on_cpu_pages_restores_verified_pages(tmp_path: Path) -> None:
    items = qualify(tmp_path, "--device", "cpu")
    assert items["gpu_pin"]["verdict"] == "skip" and "nothing to pin on a CPU" in items["gpu_pin"]["found"]
    ce = items["copy_engine"]
    assert ce["verdict"] == "ok", ce
    assert "pages verified" in ce["found"] and ce["data"]["device"] == "cpu"
    assert ce["data"]["bytes"] == 8 << 20 and ce["data"]["block_bytes"] == 256 << 10
    assert ce["data"]["load_gbps"] > 0 and ce["data"]["baseline_gbps"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA: python/tests/gpu qualifies it")
def test_asking_for_cuda_without_a_gpu_is_skipped_with_the_reason(tmp_path: Path) -> None:
    items = qualify(tmp_path, "--device", "cuda")
    for name in ("gpu_pin", "copy_engine"):
        assert items[name]["verdict"] == "skip"
        assert "--device cpu measures the copy engine on CPU pages" in items[name]["found"]
