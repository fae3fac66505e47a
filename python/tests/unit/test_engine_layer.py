"""The engine-neutral layer (`orbitkv.engine`): what both adapters share, and the
import rule that keeps it shared (source-only: no engine, torch or native module)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from orbitkv.engine.blocks import dense_run, page_reach
from orbitkv.engine.session import FIRST_BACKOFF_S, MAX_BACKOFF_S, ReconnectBackoff

PKG = Path(__file__).resolve().parents[2] / "orbitkv"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_to_its_cap_and_resets_on_success(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    b = ReconnectBackoff(logging.getLogger("orbitkv.test"), clock)
    assert b.wait_left() == 0.0, "the first attempt is never delayed"
    delays = []
    with caplog.at_level(logging.WARNING, logger="orbitkv.test"):
        for _ in range(9):
            b.failed(ConnectionRefusedError("no socket"))
            delays.append(b.delay)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert delays[0] == FIRST_BACKOFF_S and delays[-1] == MAX_BACKOFF_S
    # One warning per failed attempt, naming the cause and the next attempt.
    assert len(caplog.records) == 9
    assert "no socket" in caplog.records[0].getMessage() and "miss the external cache" in caplog.records[0].getMessage()
    assert b.wait_left() == pytest.approx(30.0)
    clock.now += 29.5
    assert b.wait_left() == pytest.approx(0.5)
    clock.now += 0.5
    assert b.wait_left() == 0.0
    b.succeeded()
    assert b.delay == 0.0 and b.wait_left() == 0.0
    b.failed(OSError("again"))
    assert b.delay == FIRST_BACKOFF_S, "a success starts the doubling over"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_adapters_share_the_engine_layer_not_each_other() -> None:
    """SGLang's adapter imports nothing from vLLM's (and vice versa); the shared layer
    imports no engine and no torch (both adapters, and `import orbitkv`, stay light)."""
    rules = {
        "sglang": ("orbitkv.vllm", "vllm"),
        "vllm": ("orbitkv.sglang", "sglang"),
        "engine": ("orbitkv.vllm", "orbitkv.sglang", "vllm", "sglang", "torch"),
    }
    checked = 0
    for sub, banned in rules.items():
        for path in sorted((PKG / sub).rglob("*.py")):
            checked += 1
            bad = sorted(n for n in _imports(path) if any(n == b or n.startswith(b + ".") for b in banned))
            assert not bad, f"{path.relative_to(PKG.parent)} imports {bad}"
    assert checked >= 20, f"only {checked} modules found under {PKG}"


def test_the_block_format_rule_for_dense_pages() -> None:
    """A page's bytes go into a block in physical order only when the page is one dense
    run: its dimensions of size > 1, by stride, tile memory with no gap or overlap."""
    # [ratio=1, H=2, N=4, C=8 bytes], logical order dense: HNC.
    assert dense_run((1, 2, 4, 8), (0, 32, 8, 1)) and page_reach((1, 2, 4, 8), (0, 32, 8, 1)) == 64
    # The same page laid out N-major (LBNHC-like): still one dense run, another order.
    assert dense_run((1, 2, 4, 8), (0, 8, 16, 1))
    # A page whose heads are interleaved with another layer's (a gap): not dense.
    assert not dense_run((1, 2, 4, 8), (0, 64, 8, 1)) and page_reach((1, 2, 4, 8), (0, 64, 8, 1)) == 96
    # Two dimensions overlapping (stride 0 on a dimension > 1): not dense.
    assert not dense_run((2, 8), (0, 1))
