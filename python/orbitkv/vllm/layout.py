"""Byte geometry of vLLM's KV pages, which defines the cached block format.

vLLM hands `register_kv_caches` one strided view per layer, `[B, H, N, C]` of the
KV dtype, over a single int8 backing allocation ordered by `KVCacheLayout`
(vllm/v1/kv_cache_interface.py: create_kv_cache_views) - or, under vLLM 0.34's extensible
KV cache on CUDA, each layer over a storage of its own at the offset it has in that one
allocation (`block_geometry` takes both; the host copy path needs one allocation). B
counts *kernel* blocks, which may split a manager block into `ratio` pieces.

The cached block format is `orbitkv.engine.blocks`'s; for vLLM the layers are taken in
address order of their pages, each page `[ratio, H, N, C]` of one manager block (its
logical order applies when a page is not one dense run: LHBNC, BHLNC). For
block-outermost layouts whose pages are contiguous (BLHNC, BLNHC) a block is exactly
its contiguous span in the backing buffer (`block_views`).
The worker hands `BlockGeometry` to the native client (`orbitkv.vllm.native.page_layout`),
whose bounds-checked `save_pages`/`restore_pages` copy pages <-> slots once; the GPU
copy engine (`orbitkv.kvcopy`, geometry from `block_geometry`) consumes the same
geometry on CUDA pages. The tests' pure-Python copier (`python/tests/support/
host_copier.py`) is the oracle both are checked against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from orbitkv.engine.blocks import dense_run, page_reach


class LayoutError(ValueError):
    """The registered KV views do not have the geometry OrbitKV expects."""


@dataclass(frozen=True)
class PageGeometry:
    """Where one layer's page of manager block `b` lives, in bytes of the backing buffer."""

    layer: str
    base: int  # byte offset of manager block 0
    block_stride: int  # bytes between manager blocks
    shape: tuple[int, ...]  # (ratio, H, N, C_bytes) of one manager block's page
    strides: tuple[int, ...]  # byte strides of `shape`
    contiguous: bool  # the page is one dense run of bytes
    page_bytes: int  # bytes of one manager block's page (product of `shape`)


@dataclass(frozen=True)
class BlockGeometry:
    pages: tuple[PageGeometry, ...]  # in address order
    num_blocks: int
    block_bytes: int
    block_span: bool  # each block is one contiguous span (fast path)
    storages: int = 1  # backing allocations the layers view (one each under vLLM 0.34's extensible KV cache)


def _flat_bytes(t: torch.Tensor) -> np.ndarray:
    """A writable uint8 numpy view of the whole storage behind `t` (zero copy)."""
    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    return flat.numpy()


def describe(kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> tuple[BlockGeometry, np.ndarray]:
    """Derive the block geometry of the released per-layer CPU views, plus the flat
    bytes of their backing buffer (what the native client copies from and to)."""
    if not kv_caches:
        raise LayoutError("register_kv_caches received no KV views")
    for name, t in kv_caches.items():
        if t.device.type != "cpu":
            raise LayoutError(
                f"layer {name!r} lives on {t.device}; the native host copy path needs CPU "
                "pages - copy CUDA pages with orbitkv.kvcopy.CopyEngine (geometry: block_geometry())"
            )
    geometry = block_geometry(kv_caches, num_blocks)
    if geometry.storages != 1:
        raise LayoutError(
            f"the KV views span {geometry.storages} allocations; the native host copy path needs every "
            "layer in one backing allocation (copy such pages with orbitkv.kvcopy.CopyEngine)"
        )
    return geometry, _flat_bytes(kv_caches[geometry.pages[0].layer])


def block_geometry(kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> BlockGeometry:
    """Derive the block geometry of the released per-layer views on any device (CPU or
    CUDA); only byte offsets and strides are read, no tensor data.

    The layers may view one backing allocation (vLLM's default) or one storage each
    (vLLM 0.34's extensible KV cache on CUDA: one virtual reservation, every layer's
    committed segment its own storage at the offset it has in one allocation). Pages are
    ordered by absolute address either way, so both give the same cached block format."""
    if not kv_caches:
        raise LayoutError("register_kv_caches received no KV views")
    pages: dict[int, PageGeometry] = {}  # absolute address of block 0's page -> geometry
    storages: dict[int, int] = {}  # storage address -> bytes
    for name, t in kv_caches.items():
        if t.dim() != 4:
            raise LayoutError(f"layer {name!r}: expected a [B, H, N, C] view, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise LayoutError(f"layer {name!r}: the content dim C is not contiguous")
        item = t.element_size()
        kb, h, n, c = (int(d) for d in t.shape)
        if kb % num_blocks:
            raise LayoutError(f"layer {name!r}: {kb} kernel blocks do not split {num_blocks} blocks")
        ratio = kb // num_blocks
        s_b, s_h, s_n, _ = (int(s) * item for s in t.stride())
        shape = (ratio, h, n, c * item)
        strides = (s_b, s_h, s_n, 1)
        base = int(t.storage_offset()) * item
        storage = t.untyped_storage()
        address = int(storage.data_ptr()) + base
        if address in pages:
            continue  # a KV-sharing layer aliasing another layer's pages
        storages[int(storage.data_ptr())] = int(storage.nbytes())
        contiguous = dense_run(shape, strides)
        pages[address] = PageGeometry(name, base, s_b * ratio, shape, strides, contiguous, ratio * h * n * c * item)
    _check_disjoint(storages)
    ordered = tuple(pages[k] for k in sorted(pages))
    block_stride = {p.block_stride for p in ordered}
    total = sum(p.page_bytes for p in ordered)
    span = (
        len(storages) == 1
        and all(p.contiguous for p in ordered)
        and len(block_stride) == 1
        and block_stride.pop() == total
        and all(ordered[i].base + ordered[i].page_bytes == ordered[i + 1].base for i in range(len(ordered) - 1))
    )
    return BlockGeometry(ordered, num_blocks, total, span, len(storages))


def _check_disjoint(storages: Mapping[int, int]) -> None:
    """Distinct storages must not share bytes: a restore into one layer would write another."""
    end = -1
    for start in sorted(storages):
        if start < end:
            raise LayoutError(
                f"the KV views' storages overlap (one at {start:#x} starts inside another that ends at {end:#x})"
            )
        end = start + storages[start]


class CpuPages:
    """Registered CPU pages: their geometry and the flat bytes of the KV buffer.

    The native client copies between these pages and arena slots (`save_pages`,
    `restore_pages`, or `restore` into `block_views` when blocks are single spans).
    Every range `block_views` returns is proven inside the buffer here."""

    def __init__(self, geometry: BlockGeometry, flat: np.ndarray) -> None:
        self.geometry = geometry
        self.flat = flat
        last = geometry.num_blocks - 1
        for page in geometry.pages:
            reach = page_reach(page.shape, page.strides)
            if page.base < 0 or page.base + last * page.block_stride + reach > flat.nbytes:
                raise LayoutError(f"layer {page.layer!r}: pages reach past the {flat.nbytes}-byte KV buffer")

    def block_views(self, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        """Writable per-block views when every block is one contiguous span, else None."""
        g = self.geometry
        if not g.block_span:
            return None
        for b in block_ids:
            if not 0 <= b < g.num_blocks:
                raise IndexError(f"block id {b} outside [0, {g.num_blocks})")
        first = g.pages[0]
        return [
            self.flat[first.base + b * first.block_stride : first.base + b * first.block_stride + g.block_bytes]
            for b in block_ids
        ]
