"""A router built only from the Managers' KV events (`benches/kv_router.py`, decoding with
the released vLLM's `KVEventBatch`) knows which of two real Managers holds each request's
longest prefix: a generated chat trace routed by the router's own predictions, every
prediction checked against real lookups on both Managers while the arenas evict."""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.native]

BENCH = Path(__file__).resolve().parents[3] / "benches" / "kv_router.py"


def test_the_event_view_predicts_the_host_with_the_longest_prefix(tmp_path: Path) -> None:
    out = tmp_path / "kv_router.json"
    cmd = [sys.executable, str(BENCH), "--generate", "600", "--hosts", "2", "--capacity", "256"]
    cmd += ["--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, timeout=600)
    r = json.loads(out.read_text())
    assert r["requests"] == 600
    assert min(r["evictions"]) > 0, "the arenas must evict, or removals go untested"
    assert r["sequence_gaps"] == 0 and r["kv_events_dropped"] == [0, 0]
    assert r["match_rate"] >= 0.99, r["mismatch_examples"]
