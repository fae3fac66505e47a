"""The copy-backend oracle (benches/sglang_kv_oracle.py, contract G4) as a gate: full
payload and sentinel coverage of partial destinations on both released dense pools, and
a deliberately corrupted cached block is flagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_env import PINNED_SGLANG, skip_module_if_unavailable

skip_module_if_unavailable()

pytestmark = pytest.mark.sglang

ORACLE = Path(__file__).resolve().parents[3] / "benches" / "sglang_kv_oracle.py"


def test_copy_backend_oracle(tmp_path: Path) -> None:
    out = tmp_path / "oracle.json"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(ORACLE), "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["sglang"] == PINNED_SGLANG
    assert [r["pool"] for r in doc["results"]] == ["MHATokenToKVPool", "MLATokenToKVPool"]
    for r in doc["results"]:
        pages = r["clean"]["bytes_checked"] // r["block_bytes"]
        assert pages >= 40  # every page of the destination pool was compared
        assert r["clean"]["mismatched_buffer_pages"] == []
        assert r["corruption"]["detected"]
