"""`benches/peers.py` in its quick mode: the JSON it writes has the documented shape and
every byte read back from OrbitKV (a real `orbitkv serve`), from memcpy and, where they
are installed here, from Redis and Mooncake Store, is right. Correctness only: no speed
is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.native
BENCH = Path(__file__).resolve().parents[3] / "benches" / "peers.py"
SIZES = [64 * 1024, 1024 * 1024]


def run_bench(tmp_path: Path, systems: str) -> dict[str, Any]:
    out = tmp_path / "peers.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--systems", systems, "--workdir", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def check_points(s: dict[str, Any], bytes_checked: bool) -> None:
    assert s["status"] == "ok", s
    assert sorted(int(k) for k in s["points"]) == SIZES
    for p in s["points"].values():
        assert p["reps"] == 1 and p["ops_per_rep"] >= 4
        for op in ("put", "get"):
            assert p[f"{op}_gbps"] > 0 and len(p[f"{op}_gbps_reps"]) == 1
            lat = p[f"{op}_lat_us"]
            assert 0 < lat["p50"] <= lat["max"], lat
        if bytes_checked:
            assert p["wrong_bytes"] == 0, p
        else:
            assert p["wrong_bytes"] is None  # redis-benchmark discards what it reads


def test_orbitkv_and_memcpy_put_and_get_every_byte_right(tmp_path: Path) -> None:
    doc = run_bench(tmp_path, "memcpy,orbitkv")
    assert doc["bench"] == "peers" and doc["sizes"] == SIZES and doc["reps"] == 1
    assert set(doc["systems"]) == {"memcpy", "orbitkv"}
    assert doc["wrong_bytes"] == 0
    for name in ("memcpy", "orbitkv"):
        check_points(doc["systems"][name], bytes_checked=True)
        samples = doc["latency_samples_us"][name]
        assert len(samples["put"]) == len(samples["get"]) == doc["ops"][str(1024 * 1024)]
    orbit = doc["systems"]["orbitkv"]
    for p in orbit["points"].values():
        assert p["misses"] == 0  # every block saved was found again
        assert set(p["get_phase_p50_us"]) == {"lookup", "restore", "release"}
    assert {"orbitkv/memcpy put @1MiB", "orbitkv/memcpy get @1MiB"} <= set(doc["ratios"])


@pytest.mark.parametrize("peer", ["redis-c", "redis-py", "mooncake"])
def test_peer_runs_here_or_is_recorded_unavailable_with_a_reason(tmp_path: Path, peer: str) -> None:
    doc = run_bench(tmp_path, f"{peer},orbitkv")
    s = doc["systems"][peer]
    if s["status"] == "unavailable":
        assert s["reason"] and "points" not in s
        pytest.skip(f"{peer} cannot run here: {s['reason']}")
    check_points(s, bytes_checked=peer != "redis-c")
    check_points(doc["systems"]["orbitkv"], bytes_checked=True)
    assert f"orbitkv/{peer} get @1MiB" in doc["ratios"]
