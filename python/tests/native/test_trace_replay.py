"""`benches/trace_replay.py` against real Manager processes: a generated chat trace
replayed by several clients with every restored byte checked, the Manager's LRU equal
to the reference LRU when one client keeps the trace's order, no policy above the
offline optimum, an SSD tier serving part of the hits, `--cache-policy` honoured,
`--policy-seed` reproducing `duel`'s figures, `--pace` issuing requests at the trace's
timestamps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.native
BENCH = Path(__file__).resolve().parents[3] / "benches" / "trace_replay.py"


def run_bench(tmp_path: Path, out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The bench, quiet, working in `tmp_path` and writing `out`, with `args`."""
    return subprocess.run(
        [sys.executable, str(BENCH), "--quiet", "--workdir", str(tmp_path), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def replay(tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "r.json"
    r = run_bench(tmp_path, out, "--generate", "1500", "--block-bytes", "4096", *args, timeout=600)
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
    doc = replay(
        tmp_path, "--capacity", "128", "--ssd-blocks", "1024", "--clients", "3", "--policies", "s3fifo-adaptive"
    )
    assert doc["mismatched_blocks"] == 0
    p = doc["rows"][0]["policies"]["s3fifo-adaptive"]
    assert p["served_from_ssd"] > 0 and p["served_from_dram"] > 0, p
    assert p["served_from_dram"] + p["served_from_ssd"] == p["blocks_served"]
    assert p["ssd_bytes_written"] > 0
    assert p["ssd_spilled_blocks"] > 0 and p["ssd_evicted_unspilled_blocks"] is not None, p


def test_the_same_policy_seed_gives_the_same_duel_figures_in_fresh_managers(tmp_path: Path) -> None:
    # One client keeps the trace's order, so the seed is the only randomness left.
    args = ("--capacity", "96", "--clients", "1", "--policies", "duel", "--policy-seed", "5", "--repeat", "2")
    doc = replay(tmp_path, *args)
    runs = doc["rows"][0]["policies"]["duel"]["runs"]
    assert [r["policy_seed"] for r in runs] == [5, 6]
    again = replay(tmp_path, *args)["rows"][0]["policies"]["duel"]["runs"]
    assert [r["blocks_served"] for r in runs] == [r["blocks_served"] for r in again]
    assert all(r["blocks_served"] > 0 and r["mismatched_blocks"] == 0 for r in runs)


def test_pace_issues_requests_no_earlier_than_their_timestamps(tmp_path: Path) -> None:
    trace = tmp_path / "timed.jsonl"
    # 40 requests 50 ms apart (2 s of trace); at --pace 2 they take at least 1 s.
    trace.write_text(
        "".join(json.dumps({"timestamp": 50 * i, "hash_ids": [0, i % 7 + 1, 100 + i]}) + "\n" for i in range(40))
    )
    out = tmp_path / "p.json"
    r = run_bench(
        tmp_path, out, "--trace", str(trace), "--block-bytes", "4096", "--capacity", "64", "--clients", "2",
        "--policies", "lru", "--pace", "2",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    p = json.loads(out.read_text())["rows"][0]["policies"]["lru"]
    assert p["paced"] and p["mismatched_blocks"] == 0 and p["blocks_served"] > 0, p
    assert p["issue_span_seconds"] >= 39 * 0.050 / 2, p
    # A generated trace has no timestamps: pacing it is refused.
    r = run_bench(tmp_path, out, "--generate", "20", "--capacity", "64", "--pace", "1")
    assert r.returncode != 0 and "--pace needs a `timestamp`" in r.stderr, r.stderr


def test_an_unknown_policy_is_refused_by_the_manager(tmp_path: Path) -> None:
    r = run_bench(
        tmp_path, tmp_path / "r.json", "--generate", "50", "--block-bytes", "4096", "--capacity", "64",
        "--policies", "mru",
    )  # fmt: skip
    assert r.returncode != 0
    assert 'unknown cache policy "mru"' in r.stderr and "s3fifo-adaptive" in r.stderr, r.stderr
