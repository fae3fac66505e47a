"""`orbitkv qualify` on a GPU host: the arena pinned for the GPU, the copy engine's
restore of random blocks verified and measured against pinned DMA in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available on this machine (no GPU or a CPU-only torch)", allow_module_level=True)

pytestmark = pytest.mark.native


def test_qualify_pins_the_arena_and_measures_the_copy_engine(tmp_path: Path, copy_kernel: str) -> None:
    r = subprocess.run(
        [
            sys.executable, "-m", "orbitkv", "qualify", "--json", "--dram-size", "2GiB", "--copy-bytes", "512MiB",
            "--socket", str(tmp_path / "r" / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    items = {i["name"]: i for i in json.loads(r.stdout)["items"]}
    pin = items["gpu_pin"]
    assert pin["verdict"] == "ok" and pin["data"]["arena_bytes"] == 2 << 30 and pin["data"]["seconds"] > 0
    ce = items["copy_engine"]
    assert ce["verdict"] in ("ok", "warn") and "pages verified" in ce["found"], ce
    assert ce["data"]["kernel"] == copy_kernel and ce["data"]["device"].startswith("cuda")
    assert ce["data"]["load_gbps"] > 0 and ce["data"]["baseline_gbps"] > 0
