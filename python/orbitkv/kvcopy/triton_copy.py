"""One-pass copies between arena slots and KV pages: a Triton kernel that reads each
block's bytes where they are and writes them where they go, with no staging buffer
(the `torch` kernel gathers into a staging buffer, then places it: two passes).

A page is described as runs (`orbitkv.kvcopy.runs`); the cached form is those runs
back to back, in logical order (see `orbitkv.kvcopy.layout.LayerPages`). Importing this
module imports Triton; `CopyEngine` imports it only when the Triton kernel is selected.
Under Triton's interpreter (TRITON_INTERPRET=1) the kernel also runs on CPU tensors: the
tests use that to check it on machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from orbitkv.kvcopy.runs import Runs

# Integer arguments are not specialised on their values (Triton compiles a variant per
# "== 1" / "divisible by 16" pattern otherwise): one compiled kernel per (direction,
# element size, block), all built by `warm_up` before the first copy.
_INT_ARGS = ["layer_off", "page_base", "block_stride", "d1", "d2", "s0", "s1", "s2", "run"]


@triton.jit(do_not_specialize=_INT_ARGS)
def _copy_runs(
    arena,
    pages,
    slots,  # int64 [n]: byte offset of each block's slot in the arena segment
    ids,  # int64 [n]: each block's page id
    layer_off,  # byte offset of this layer inside a cached block
    page_base,  # byte offset of page 0 in `pages`
    block_stride,  # bytes from one page to the next
    d1,
    d2,
    s0,
    s1,
    s2,
    run,
    TO_PAGES: tl.constexpr,
    ELEM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    j = tl.program_id(0)  # block of the batch
    r = tl.program_id(1).to(tl.int64)  # run of the page
    c = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = c < run
    i2 = r % d2
    t = r // d2
    i1 = t % d1
    i0 = t // d1
    a = (tl.load(slots + j) + layer_off) // ELEM + r * run + c
    p = (tl.load(ids + j) * block_stride + page_base) // ELEM + i0 * s0 + i1 * s1 + i2 * s2 + c
    if TO_PAGES:
        tl.store(pages + p, tl.load(arena + a, mask=m), mask=m)
    else:
        tl.store(arena + a, tl.load(pages + p, mask=m), mask=m)


def _block(run: int) -> int:
    return min(2048, max(128, triton.next_power_of_2(run)))


def copy_runs(
    arena: torch.Tensor,
    pages: torch.Tensor,
    slots: torch.Tensor,
    ids: torch.Tensor,
    *,
    layer_off: int,
    page_base: int,
    block_stride: int,
    runs: Runs,
    elem: int,
    to_pages: bool,
    warm_up: bool = False,
) -> None:
    """Copy `slots.numel()` blocks between `arena` and `pages` (1-D tensors of `elem`-byte
    elements, on the current stream): block j's cached layer bytes at byte
    `slots[j] + layer_off` of `arena`, its page at byte `page_base + ids[j] * block_stride`
    of `pages`, made of `runs`.

    `warm_up=True` moves nothing: one program copying runs of 0 elements (`slots` and
    `ids` need one valid entry), to compile the variant before the first real copy. The
    integer arguments must be the real ones: their width (32 or 64 bits) is part of the
    compiled variant."""
    n = slots.numel()
    if n == 0:
        return
    block = _block(runs.run)
    grid = (1, 1, 1) if warm_up else (n, runs.count, triton.cdiv(runs.run, block))
    _copy_runs[grid](
        arena,
        pages,
        slots,
        ids,
        layer_off,
        page_base,
        block_stride,
        runs.sizes[1],
        runs.sizes[2],
        runs.strides[0],
        runs.strides[1],
        runs.strides[2],
        0 if warm_up else runs.run,
        TO_PAGES=to_pages,
        ELEM=elem,
        BLOCK=block,
    )
