"""torch CPU tensors as zero-copy sources and destinations (runs where torch is
installed, e.g. inside the cached vLLM venv; skipped with a reason elsewhere)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

pytestmark = pytest.mark.native
BB = 16 * 1024


def test_bf16_and_fp16_tensors_round_trip_without_copies(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(b"\x31" * 32, BB)
    hs = [bytes([i]) * 32 for i in range(1, 5)]
    src = torch.randn(4, BB // 2).to(torch.bfloat16)  # 4 blocks of BB bytes
    r = c.save(ns, hs, src)
    assert r.stored == 4 and r.bytes_copied == 4 * BB
    # Per-block destinations: views into one fp16 "KV pages" tensor, written in place.
    pages = torch.zeros(8, BB // 2, dtype=torch.float16)
    lease = c.lookup(ns, hs)
    n = c.restore(lease, [pages[i] for i in (6, 1, 3, 0)])
    c.release(lease)
    assert n == 4 * BB
    got = torch.stack([pages[i] for i in (6, 1, 3, 0)]).view(torch.uint8)
    assert torch.equal(got, src.view(torch.uint8))
    assert not pages[[2, 4, 5, 7]].any()


def test_non_contiguous_and_cuda_tensors_are_rejected(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(b"\x32" * 32, BB)
    t = torch.zeros(BB, 2, dtype=torch.uint8).t()  # non-contiguous
    with pytest.raises(ValueError, match="contiguous"):
        c.save(ns, [b"\x01" * 32], [t[0]])
