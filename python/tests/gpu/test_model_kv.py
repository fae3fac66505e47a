"""Gate G4 on a CUDA GPU: model-computed KV saved through a real Manager from
vLLM-style paged KV in one process, restored into fresh pages in another, decode
continued; greedy tokens and the logits of every decode step bit-identical to a
process that recomputed the prompt. The roles and assertions: `model_kv.py`.

Skips, with the reason, where torch, transformers or a CUDA device is missing.
Run with `python -m pytest -q -rs python/tests/gpu`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the GPU tests need it")
pytest.importorskip("transformers", reason="transformers is not installed: the model-computed KV test needs it")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch: the GPU tests run on a GPU host", allow_module_level=True)

from model_kv import check_g4  # noqa: E402

pytestmark = pytest.mark.native


def test_model_kv_restored_bit_identical_on_cuda(manager_factory: Callable[..., object], tmp_path: Path) -> None:
    m = manager_factory("--dram-size", "64MiB", "--segment-size", "16MiB")
    result = check_g4(m.socket, tmp_path, "cuda")  # type: ignore[attr-defined]
    print(
        f"G4 on {torch.cuda.get_device_name()}: {result['blocks']} blocks of {result['block_bytes']} bytes, "
        f"decoded {result['tokens']}"
    )
