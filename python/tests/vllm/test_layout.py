"""Host copy oracle over the released KV page layouts (G4, CPU part).

Pages are allocated by vLLM's own `allocate_kv_cache` for every `KVCacheLayout`;
OrbitKV's gather/scatter must move exactly one block's bytes, leave every other block
(the sentinels) untouched, and use the zero-staging per-block span exactly for the
block-outermost layouts whose pages are dense.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import numpy as np
import pytest
import torch
from host_copier import HostCopier
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache
from vllm_harness import LAYERS, make_kv_cache_config, per_layer_storage_views

from orbitkv.vllm.layout import LayoutError, block_geometry, describe

pytestmark = pytest.mark.vllm

NUM_BLOCKS = 12


def _pages(layout: str) -> tuple[dict[str, torch.Tensor], HostCopier]:
    kc = make_kv_cache_config(NUM_BLOCKS, layout)
    kv = allocate_kv_cache(kc, torch.device("cpu"), KVCacheLayout[layout])
    geometry, flat = describe(kv, NUM_BLOCKS)
    flat[:] = np.random.default_rng(7).integers(0, 256, size=flat.shape, dtype=np.uint8)
    return kv, HostCopier(geometry, flat)


def _block_bytes(kv: dict[str, torch.Tensor], block: int) -> bytes:
    """Logical [H, N, C] bytes of `block` in every layer, read through vLLM's views."""
    return b"".join(kv[name].view(torch.uint8)[block].contiguous().numpy().tobytes() for name in LAYERS)


def _assert_moved(
    kv: dict[str, torch.Tensor], layout: str, before: dict[int, bytes], blocks: list[int], dst: list[int]
) -> None:
    """Block `dst[i]` now holds what block `blocks[i]` held `before`; every other block is untouched."""
    for b in range(NUM_BLOCKS):
        after = _block_bytes(kv, b)
        if b in dst:
            assert after == before[blocks[dst.index(b)]], f"{layout}: block {b} not restored"
        else:
            assert after == before[b], f"{layout}: sentinel block {b} was touched"


@pytest.mark.parametrize("layout", [layout.name for layout in KVCacheLayout])
def test_gather_scatter_roundtrip_with_sentinels(layout: str) -> None:
    kv, copier = _pages(layout)
    g = copier.geometry
    assert g.block_bytes == sum(kv[n][0].numel() * kv[n].element_size() for n in LAYERS)
    blocks = [3, 7, 1]
    before = {b: _block_bytes(kv, b) for b in range(NUM_BLOCKS)}
    staged = copier.gather(blocks)
    assert staged.shape == (3, g.block_bytes)
    # Move block 3 -> 10, 7 -> 0, 1 -> 5 and check only those destinations changed.
    dst = [10, 0, 5]
    copier.scatter(staged, dst)
    _assert_moved(kv, layout, before, blocks, dst)


@pytest.mark.parametrize("layout", [layout.name for layout in KVCacheLayout])
def test_block_span_fast_path_only_where_blocks_are_contiguous(layout: str) -> None:
    _, copier = _pages(layout)
    lay = KVCacheLayout[layout]
    expect_span = lay.is_block_outermost and lay.is_block_compact
    assert copier.geometry.block_span == expect_span
    views = copier.block_views([2, 9])
    if not expect_span:
        assert views is None
        return
    assert views is not None
    staged = copier.gather([2, 9])
    assert bytes(views[0]) == staged[0].tobytes() and bytes(views[1]) == staged[1].tobytes()


def test_kernel_block_split_moves_whole_manager_blocks() -> None:
    """A kernel block size below the manager block size splits each block in two."""
    kc = make_kv_cache_config(NUM_BLOCKS, "LBNHC")
    kv = allocate_kv_cache(kc, torch.device("cpu"), KVCacheLayout.LBNHC, kernel_block_sizes=[8])
    assert next(iter(kv.values())).shape[0] == 2 * NUM_BLOCKS
    geometry, flat = describe(kv, NUM_BLOCKS)
    flat[:] = np.random.default_rng(3).integers(0, 256, size=flat.shape, dtype=np.uint8)
    copier = HostCopier(geometry, flat)
    assert geometry.pages[0].shape[0] == 2  # two kernel blocks per manager block

    def manager_block(b: int) -> bytes:
        return b"".join(kv[n].view(torch.uint8)[2 * b : 2 * b + 2].contiguous().numpy().tobytes() for n in LAYERS)

    before = {b: manager_block(b) for b in range(NUM_BLOCKS)}
    copier.scatter(copier.gather([4]), [9])
    for b in range(NUM_BLOCKS):
        assert manager_block(b) == (before[4] if b == 9 else before[b])


@pytest.mark.parametrize("layout", [layout.name for layout in KVCacheLayout])
def test_native_page_copies_match_the_host_oracle(layout: str, orbit_manager) -> None:  # type: ignore[no-untyped-def]
    """The worker's copy path (the client's bounds-checked `save_pages` /
    `restore_pages` over the released pages) moves exactly what the `HostCopier`
    oracle moves, through real arena slots, and touches no other block."""
    from orbitkv import _native
    from orbitkv.vllm.native import page_layout

    kv, copier = _pages(layout)
    g = copier.geometry
    flat = copier._flat
    native_layout = page_layout(g, flat.nbytes)
    assert native_layout.block_bytes == g.block_bytes
    blocks, dst = [3, 7, 1], [10, 0, 5]
    oracle = copier.gather(blocks)
    before = {b: _block_bytes(kv, b) for b in range(NUM_BLOCKS)}
    hashes = [bytes([i]) * 32 for i in range(len(blocks))]
    with _native.Client(str(orbit_manager.socket_path)) as c:
        ns = c.register_namespace(b"\x5a" * 32, g.block_bytes)
        with c.begin_save(ns, hashes) as pending:
            assert c.save_pages(pending, native_layout, flat, blocks) == len(blocks) * g.block_bytes
            c.commit_save(pending)
        staged = bytearray(len(blocks) * g.block_bytes)
        with c.lookup(ns, hashes) as lease:
            c.restore(lease, staged)  # the cached bytes, block by block
            assert bytes(staged) == oracle.tobytes(), f"{layout}: cached block format differs from the oracle"
            assert c.restore_pages(lease, native_layout, flat, dst) == len(dst) * g.block_bytes
    _assert_moved(kv, layout, before, blocks, dst)


# ---- layers in storages of their own (vLLM 0.34's extensible KV cache) ------------------

LAYER_OUTERMOST = [layout.name for layout in KVCacheLayout if layout.name.startswith("L")]
BLOCK_OUTERMOST = [layout.name for layout in KVCacheLayout if layout.name.startswith("B")]


@pytest.mark.parametrize("layout", LAYER_OUTERMOST)
def test_layers_in_their_own_storages_keep_the_one_allocation_format(layout: str) -> None:
    """Each layer over a storage of its own, at the address it had: the pages, their order
    and the block size are those of the one allocation, so the cached format is the same;
    the native host path (one flat buffer) refuses them, naming the copy engine."""
    kv, _ = _pages(layout)
    one = block_geometry(kv, NUM_BLOCKS)
    split = block_geometry(per_layer_storage_views(kv), NUM_BLOCKS)
    assert (one.storages, split.storages) == (1, len(LAYERS))
    assert [(p.layer, p.shape, p.strides, p.page_bytes) for p in split.pages] == [
        (p.layer, p.shape, p.strides, p.page_bytes) for p in one.pages
    ]
    assert split.block_bytes == one.block_bytes and not split.block_span
    assert all(p.base == 0 for p in split.pages)  # each page set starts its storage
    with pytest.raises(LayoutError, match=rf"span {len(LAYERS)} allocations.*orbitkv.kvcopy.CopyEngine"):
        describe(per_layer_storage_views(kv), NUM_BLOCKS)


@pytest.mark.parametrize("layout", BLOCK_OUTERMOST)
def test_storages_that_share_bytes_are_refused(layout: str) -> None:
    """Under block-outermost layouts every layer's pages interleave with the others': one
    storage per layer would overlap, and a restore into one layer would write another."""
    kv, _ = _pages(layout)
    with pytest.raises(LayoutError, match="storages overlap"):
        block_geometry(per_layer_storage_views(kv), NUM_BLOCKS)
