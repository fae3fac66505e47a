"""The pure-Python copier between CPU KV pages and block-sized buffers: the oracle the
native client's page copies and the GPU copy engine (`orbitkv.kvcopy`) are checked
against. Test-only: the adapters copy through the native client or `orbitkv.kvcopy`.

It applies the cached block format (`orbitkv.engine.blocks`) to vLLM's page geometry
(`orbitkv.vllm.layout`) with `ctypes.memmove` for dense pages and numpy strided views
otherwise.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence

import numpy as np

from orbitkv.vllm.layout import BlockGeometry, CpuPages, PageGeometry


class HostCopier(CpuPages):
    """Gathers cached blocks from, and scatters them into, CPU KV pages.

    Copies go page by page to or from raw block-sized addresses (arena slots, or a
    staging buffer). Every source range is proven inside the KV buffer once (by
    `CpuPages`); destinations are the caller's to size (`block_bytes` each).
    """

    def __init__(self, geometry: BlockGeometry, flat: np.ndarray) -> None:
        super().__init__(geometry, flat)
        self._flat = flat
        self._base = int(flat.ctypes.data)

    def _check(self, block_ids: Sequence[int]) -> None:
        for b in block_ids:
            if not 0 <= b < self.geometry.num_blocks:
                raise IndexError(f"block id {b} outside [0, {self.geometry.num_blocks})")

    def _page(self, page: PageGeometry, block: int) -> np.ndarray:
        start = page.base + block * page.block_stride
        if page.contiguous:
            return self._flat[start : start + page.page_bytes]
        return np.lib.stride_tricks.as_strided(
            self._flat[start:], shape=page.shape, strides=page.strides, writeable=True
        )

    def gather(self, block_ids: Sequence[int]) -> np.ndarray:
        """Copy blocks into one staging buffer of len(block_ids) * block_bytes."""
        bb = self.geometry.block_bytes
        out = np.empty((len(block_ids), bb), dtype=np.uint8)
        base = int(out.ctypes.data)
        self.gather_to([base + i * bb for i in range(len(block_ids))], block_ids)
        return out

    def scatter(self, staging: np.ndarray, block_ids: Sequence[int]) -> None:
        """Copy blocks from a staging buffer (as produced by `gather`) into pages."""
        bb = self.geometry.block_bytes
        src = np.ascontiguousarray(staging, dtype=np.uint8).reshape(-1)
        if src.nbytes != len(block_ids) * bb:
            raise ValueError(f"staging holds {src.nbytes} bytes, {len(block_ids)} blocks need {len(block_ids) * bb}")
        base = int(src.ctypes.data)
        self.scatter_from([base + i * bb for i in range(len(block_ids))], block_ids)

    def _page_spans(self, addrs: Sequence[int], block_ids: Sequence[int]) -> Iterator[tuple[int, PageGeometry, int]]:
        """(address, page, block) for each page of each block: block `block_ids[i]`'s
        pages lie back to back from `addrs[i]`, in page order."""
        self._check(block_ids)
        for addr, b in zip(addrs, block_ids, strict=True):
            off = 0
            for page in self.geometry.pages:
                yield addr + off, page, b
                off += page.page_bytes

    def gather_to(self, dst: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copy each block to its address in `dst` (`block_bytes` writable bytes each)."""
        for addr, page, b in self._page_spans(dst, block_ids):
            if page.contiguous:
                ctypes.memmove(addr, self._base + page.base + b * page.block_stride, page.page_bytes)
            else:
                _raw(addr, page.page_bytes).reshape(page.shape)[...] = self._page(page, b)

    def scatter_from(self, src: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copy each block from its address in `src` (`block_bytes` bytes each) into its pages."""
        for addr, page, b in self._page_spans(src, block_ids):
            if page.contiguous:
                ctypes.memmove(self._base + page.base + b * page.block_stride, addr, page.page_bytes)
            else:
                self._page(page, b)[...] = _raw(addr, page.page_bytes).reshape(page.shape)


def _raw(address: int, nbytes: int) -> np.ndarray:
    """A uint8 view of `nbytes` at `address` (the caller proved the range)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
