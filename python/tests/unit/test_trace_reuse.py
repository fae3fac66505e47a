"""benches/trace_reuse.py on a hand-built trace whose continuations are known."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benches" / "trace_reuse.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trace_reuse", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["trace_reuse"] = mod
    spec.loader.exec_module(mod)
    return mod


# 0: a first turn; 1: another chat; 2 continues 0 (all of its blocks);
# 3 continues 2 (all but 2's last, partial block 8); 4 continues 1; 5 shares
# only block 0 (a system prompt), so it is a first turn.
TRACE = [
    {"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 1000, "input_length": 900, "output_length": 500, "hash_ids": [0, 5, 6]},
    {"timestamp": 5000, "input_length": 3000, "output_length": 20, "hash_ids": [0, 1, 2, 3, 7, 8]},
    {"timestamp": 9000, "input_length": 3500, "output_length": 5, "hash_ids": [0, 1, 2, 3, 7, 9, 10]},
    {"timestamp": 11000, "input_length": 1200, "output_length": 5, "hash_ids": [0, 5, 11]},
    {"timestamp": 12000, "input_length": 600, "output_length": 5, "hash_ids": [0, 12]},
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    return p


def test_continuations_turns_and_gaps(trace: Path) -> None:
    m = _module()
    reqs = m.load(str(trace))
    c = m.chains(reqs)
    assert c.hit_depth == [0, 1, 4, 5, 2, 1]
    assert c.turn == [1, 1, 2, 3, 2, 1]
    assert c.continued_by == {0: [2], 2: [3], 1: [4]}
    rows = {r["turn"]: r for r in m.continuation_table(reqs, c)}
    assert rows[1]["requests"] == 3 and rows[1]["p_continue"] == pytest.approx(2 / 3, abs=1e-3)
    assert rows[1]["median_gap_s"] == 7.5  # gaps 5 s (0 -> 2) and 10 s (1 -> 4)
    assert rows[2] == {"turn": 2, "requests": 2, "p_continue": 0.5, "median_gap_s": 4.0, "median_gap_requests": 1}
    assert rows[3]["p_continue"] == 0.0 and rows[3]["median_gap_s"] is None
    by_out = {r["bucket"]: r for r in m.by_feature(reqs, c, "output_length", m.OUTPUT_EDGES)}
    assert by_out["0-9"] == {"bucket": "0-9", "requests": 3, "p_continue": 0.0}
    assert by_out["10-49"]["p_continue"] == 1.0 and by_out["400-799"]["p_continue"] == 1.0
    assert m.gap_quantiles(reqs, c)["p50"] == 5.0


def test_static_hindsight_keeps_the_most_requested_blocks(trace: Path) -> None:
    m = _module()
    reqs = m.load(str(trace))
    # 25 blocks requested; block 0 six times, 1, 2, 3 three times, 5 and 7 twice.
    assert m.static_hindsight(reqs, 1) == pytest.approx(5 / 25)
    assert m.static_hindsight(reqs, 4) == pytest.approx(11 / 25)
    assert m.static_hindsight(reqs, 100) == pytest.approx(13 / 25)


def test_main_writes_json_and_rejects_bad_input(trace: Path, tmp_path: Path) -> None:
    m = _module()
    out = tmp_path / "r" / "reuse.json"
    assert m.main(["--trace", str(trace), "--capacity", "1,4", "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert r["continuations"] == 3 and r["static_hindsight"] == {"1": 0.2, "4": 0.44}
    with pytest.raises(SystemExit) as e:
        m.main(["--trace", str(trace), "--capacity", "0"])
    assert e.value.code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hash_ids": [1, -2]}\n')
    with pytest.raises(SystemExit, match="non-negative integers"):
        m.load(str(bad))
