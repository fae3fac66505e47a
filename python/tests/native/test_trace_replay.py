"""`benches/trace_replay.py` against real Manager processes: a generated chat trace
replayed by several clients with every restored byte checked, the Manager's LRU equal
to the reference LRU when one client keeps the trace's order, no policy above the
offline optimum, an SSD tier serving part of the hits, `--cache-policy` honoured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.native
BENCH = Path(__file__).resolve().parents[3] / "benches" / "trace_replay.py"


def replay(tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--generate", "1500", "--block-bytes", "4096", "--quiet",
         "--workdir", str(tmp_path), "--out", str(out), *args],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())


def test_one_client_in_trace_order_reproduces_the_reference_lru(tmp_path: Path) -> None:
    doc = replay(tmp_path, "--capacity", "96,400", "--clients", "1", "--policies", "lru,s3fifo-adaptive")
    assert doc["mismatched_blocks"] == 0
    for row in doc["rows"]:
        lru = row["policies"]["lru"]
        assert lru["blocks_served"] > 0
        assert lru["hit_rate"] == pytest.approx(row["lru"], abs=1e-12), row
        for name, p in row["policies"].items():
            assert p["hit_rate"] <= row["optimum"] + 1e-12, (name, p["hit_rate"], row["optimum"])
            assert p["served_from_ssd"] == 0 and p["restores_failed"] == 0


def test_several_clients_and_an_ssd_tier_serve_exact_bytes_from_both_tiers(tmp_path: Path) -> None:
    doc = replay(tmp_path, "--capacity", "128", "--ssd-blocks", "1024", "--clients", "3",
                 "--policies", "s3fifo-adaptive")
    assert doc["mismatched_blocks"] == 0
    p = doc["rows"][0]["policies"]["s3fifo-adaptive"]
    assert p["served_from_ssd"] > 0 and p["served_from_dram"] > 0, p
    assert p["served_from_dram"] + p["served_from_ssd"] == p["blocks_served"]
    assert p["ssd_bytes_written"] > 0


def test_an_unknown_policy_is_refused_by_the_manager(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--generate", "50", "--block-bytes", "4096", "--quiet", "--capacity", "64",
         "--policies", "mru", "--workdir", str(tmp_path), "--out", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode != 0
    assert "unknown cache policy \"mru\"" in r.stderr and "s3fifo-adaptive" in r.stderr, r.stderr
