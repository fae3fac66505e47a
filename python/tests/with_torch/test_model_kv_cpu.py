"""Gate G4's plumbing on the CPU (float32 model small enough for CI): the same
three processes as python/tests/gpu/test_model_kv.py — save from paged KV through
a real Manager, restore into fresh pages in another process and decode, recompute —
with CPU pages through the same `orbitkv.kvcopy.CopyEngine` interface. Asserts
restored pages byte-exact, greedy tokens equal and every decode step's logits
bit-identical to recomputation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: run this suite in the vLLM venv")
pytest.importorskip("transformers", reason="transformers is not installed: run this suite in the vLLM venv")

from model_kv import check_g4  # noqa: E402

pytestmark = pytest.mark.native


def test_model_kv_restored_bit_identical_on_cpu(manager_factory: Callable[..., object], tmp_path: Path) -> None:
    m = manager_factory("--dram-size", "32MiB", "--segment-size", "16MiB")
    result = check_g4(m.socket, tmp_path, "cpu")  # type: ignore[attr-defined]
    assert len(result["tokens"]) == 8
