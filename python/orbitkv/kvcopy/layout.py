"""Where each layer's page of a manager block lives in the KV allocation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any, Protocol

import torch

from orbitkv.engine.blocks import dense_run, page_reach


class _PageGeometryLike(Protocol):
    # Read-only: `from_geometry` only reads them, and `PageGeometry` is a frozen dataclass.
    @property
    def base(self) -> int: ...
    @property
    def block_stride(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def page_bytes(self) -> int: ...


@dataclass(frozen=True)
class LayerPages:
    """Where one layer's page of manager block b lives inside `backing`.

    Page b starts at byte `base + b * block_stride` of `backing` and is the strided
    array `shape` / `strides` (bytes; the last dim counts bytes). Its cached form is
    the one block format (`orbitkv.engine.blocks`): the page's bytes in physical order
    when it is one dense run (`contiguous`), else in logical (`shape`) order.
    `num_blocks` (an addition to the agreed API) bounds the block ids; None means
    every block whose page fits in `backing`.
    """

    backing: torch.Tensor  # 1-D uint8 tensor over the whole KV allocation (cpu or cuda)
    base: int
    block_stride: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    page_bytes: int
    num_blocks: int | None = None

    def __post_init__(self) -> None:
        b = self.backing
        if b.dtype != torch.uint8 or b.dim() != 1 or (b.numel() > 1 and b.stride(0) != 1):
            raise ValueError(
                f"backing must be a contiguous 1-D uint8 tensor, got dtype {b.dtype} shape "
                f"{tuple(b.shape)} strides {tuple(b.stride())}"
            )
        if len(self.shape) != len(self.strides) or not self.shape:
            raise ValueError(f"shape {self.shape} and strides {self.strides} must have the same length >= 1")
        if any(d <= 0 for d in self.shape) or any(s < 0 for s in self.strides):
            raise ValueError(f"shape {self.shape} must be positive and strides {self.strides} non-negative")
        if self.page_bytes != prod(self.shape):
            raise ValueError(f"page_bytes is {self.page_bytes}, expected the product of shape {self.shape}")
        if self.base < 0 or self.block_stride <= 0:
            raise ValueError(f"base {self.base} must be >= 0 and block_stride {self.block_stride} > 0")
        if self.num_blocks is not None and self.num_blocks > self.capacity:
            raise ValueError(
                f"{self.num_blocks} blocks reach past the {b.numel()}-byte backing (it holds {self.capacity})"
            )

    @property
    def reach(self) -> int:
        """Bytes from a page's first byte to one past its last."""
        return page_reach(self.shape, self.strides)

    @property
    def contiguous(self) -> bool:
        """The page is one dense run of `page_bytes` bytes starting at its first byte."""
        return dense_run(self.shape, self.strides)

    @property
    def capacity(self) -> int:
        """How many blocks' pages lie inside `backing`."""
        room = self.backing.numel() - self.base - self.reach
        return 0 if room < 0 else room // self.block_stride + 1

    @property
    def blocks(self) -> int:
        """The number of valid block ids."""
        return self.capacity if self.num_blocks is None else self.num_blocks

    @staticmethod
    def from_geometry(backing: torch.Tensor, g: _PageGeometryLike, num_blocks: int | None = None) -> LayerPages:
        """From a geometry duck-typed like `orbitkv.vllm.layout.PageGeometry`."""
        return LayerPages(
            backing,
            int(g.base),
            int(g.block_stride),
            tuple(int(d) for d in g.shape),
            tuple(int(s) for s in g.strides),
            int(g.page_bytes),
            num_blocks,
        )


def backing_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 tensor over the whole storage behind `t` (zero copy, same device)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def layer_pages(kv_caches: Mapping[str, Any], num_blocks: int) -> list[LayerPages]:
    """The pages of vLLM's released `[B, H, N, C]` per-layer views (any device), in the
    address order that defines the cached block format (`orbitkv.vllm.layout`), each over
    the storage its layer views (one for all layers, or one per layer under vLLM 0.34's
    extensible KV cache)."""
    from orbitkv.vllm.layout import block_geometry

    geometry = block_geometry(kv_caches, num_blocks)
    backings: dict[int, torch.Tensor] = {}  # one byte view per storage (one, or one per layer)
    out = []
    for p in geometry.pages:
        storage = kv_caches[p.layer].untyped_storage().data_ptr()
        if storage not in backings:
            backings[storage] = backing_bytes(kv_caches[p.layer])
        out.append(LayerPages.from_geometry(backings[storage], p, num_blocks))
    return out
