"""The cached block format, defined once for every engine and copy path.

A cached OrbitKV block is the concatenation, over the engine's KV layers in the
order the adapter fixes (vLLM: layers in address order of their pages; SGLang: K then
V of each layer, layers in order), of that layer's *page* for the block. A page is a
strided byte array (`shape`, `strides` in bytes; the last dimension counts bytes)
starting at `base + block * block_stride` in the KV allocation, and its bytes go into
the block

- in physical (address) order when the page is one dense run of bytes
  (`dense_run`): e.g. vLLM's LBNHC pages, whose physical order is not the logical
  [H, N, C] one, are copied as they lie;
- in logical (`shape`) order otherwise.

Every copier follows it: the native client's `PageLayout` (`save_pages`,
`restore_pages`), the GPU copy engine (`orbitkv.kvcopy`) and the tests' pure-Python
oracle (`python/tests/support/host_copier.py`). Two engines share a block only when
their namespace fingerprints (which bind the layout) match.
"""

from __future__ import annotations

from collections.abc import Sequence


def dense_run(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when a page of `shape` / `strides` (bytes) is one dense run of bytes: its
    dimensions of size > 1, sorted by stride, tile memory with no gap or overlap."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape, strict=True) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def page_reach(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Bytes from a page's first byte to one past its last."""
    return sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
