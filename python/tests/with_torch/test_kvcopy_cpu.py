"""The copy engine (`orbitkv.kvcopy`) on CPU pages, against a real Manager: every vLLM
0.31.0 KV layout, byte-exact round trips through arena slots, and the cached block
format equal to the host copy path (`HostCopier`, the oracle). Runs where torch is
installed (the cached vLLM venv in CI), skipped with the reason elsewhere. The cases
marked `triton` run the one-pass Triton kernel on CPU pages under Triton's interpreter:
only with TRITON_INTERPRET=1 set before the run (scripts/test.sh runs them so)."""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

import kv_layouts  # noqa: E402
import numpy as np  # noqa: E402
from host_copier import HostCopier  # noqa: E402
from kv_layouts import LAYOUTS, Shape  # noqa: E402

from orbitkv.kvcopy import ArenaView, CopyEngine, LayerPages, layer_pages, slots_array  # noqa: E402
from orbitkv.vllm.layout import describe  # noqa: E402

pytestmark = pytest.mark.native

SHAPES = {
    "aligned": Shape(layers=3, blocks=24, heads=4, tokens=16, content=32),  # 4 KiB pages
    "odd": Shape(layers=2, blocks=17, heads=3, tokens=5, content=6, dtype=torch.float16, pad=6),  # 180-byte pages
}
CASES = [(layout, shape) for layout in LAYOUTS for shape in SHAPES]
CASES.append(("LBNHC", "split"))  # a kernel block size half the manager block size
SHAPES["split"] = Shape(layers=2, blocks=12, heads=2, tokens=16, content=16, ratio=2)


KERNELS = ["torch", "triton"]


def _engine(layers: list[LayerPages], arena: ArenaView, kernel: str) -> CopyEngine:
    if kernel == "triton":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("the Triton kernel runs on CPU pages only under TRITON_INTERPRET=1 (scripts/test.sh sets it)")
        pytest.importorskip("triton", reason="triton is not installed in this environment")
    engine = CopyEngine(layers, arena, kernel=kernel)
    assert engine.kernel == kernel, engine.kernel_reason
    return engine


def _pages(layout: str, s: Shape, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[LayerPages]]:
    raw = kv_layouts.random_backing(s, seed)
    kv = kv_layouts.views(raw, layout, s)
    return raw, kv, layer_pages(kv, s.blocks)


def _expected_after_scatter(raw: torch.Tensor, layout: str, s: Shape, staged: bytes, ids: list[int]) -> torch.Tensor:
    """The oracle: `raw` after HostCopier scatters `staged` into blocks `ids`."""
    out = raw.clone()
    geometry, flat = describe(kv_layouts.views(out, layout, s), s.blocks)
    copier = HostCopier(geometry, flat)
    import numpy as np

    copier.scatter(np.frombuffer(staged, dtype=np.uint8), ids)
    return out


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("layout", "shape"), CASES)
def test_round_trip_through_the_arena_matches_the_host_oracle(layout: str, shape: str, kernel: str, manager) -> None:  # type: ignore[no-untyped-def]
    s = SHAPES[shape]
    rng = random.Random(f"{layout}-{shape}")
    src_raw, src_kv, src_layers = _pages(layout, s, seed=1)
    dst_raw, _, dst_layers = _pages(layout, s, seed=2)
    c = manager.client()
    arena = ArenaView(c, "cpu")
    try:
        src = _engine(src_layers, arena, kernel)
        dst = _engine(dst_layers, arena, kernel)
        assert src.block_bytes == len(kv_layouts.page_bytes_of(src_kv, s, 0))
        assert src.num_layers == s.layers and src.num_blocks == s.blocks
        ns = c.register_namespace(bytes([len(layout)]) * 32, src.block_bytes)
        n = 7
        src_ids = rng.sample(range(s.blocks), n)
        hashes = [rng.randbytes(32) for _ in range(n)]
        geometry, flat = describe(src_kv, s.blocks)
        oracle = HostCopier(geometry, flat).gather(src_ids).tobytes()
        src_before = src_raw.clone()

        with c.begin_save(ns, hashes) as pending:
            slots = pending.slots
            assert all(slot is not None for slot in slots)
            handle = src.save(src_ids, slots)
            assert handle.query()
            handle.synchronize()
            c.commit_save(pending)
        assert torch.equal(src_raw, src_before), "a save wrote to its source pages"

        staged = bytearray(n * src.block_bytes)
        with c.lookup(ns, hashes) as lease:
            assert lease.hit_blocks == n
            c.restore(lease, staged)
            assert bytes(staged) == oracle, f"{layout}/{shape}: engine slot bytes differ from HostCopier.gather_to"
            got = c.acquire(lease)
            # A partial destination: blocks 2.. of the lease into random distinct blocks.
            dst_ids = rng.sample(range(s.blocks), n - 2)
            expected = _expected_after_scatter(dst_raw, layout, s, oracle[2 * src.block_bytes :], dst_ids)
            load = dst.load(got[2:], dst_ids)
            assert load.query()
            for i in range(s.layers):
                load.wait_layer(i)
        assert not torch.equal(dst_raw, expected.new_zeros(expected.shape))
        assert torch.equal(dst_raw, expected), f"{layout}/{shape}: restored pages or sentinel bytes differ"
        dst_kv = kv_layouts.views(dst_raw, layout, s)
        for b, i in zip(dst_ids, range(2, n), strict=True):
            assert kv_layouts.page_bytes_of(dst_kv, s, b) == kv_layouts.page_bytes_of(src_kv, s, src_ids[i])
    finally:
        arena.close()
        c.close()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_blocks_saved_by_the_host_path_load_through_the_engine(layout: str, kernel: str, manager) -> None:  # type: ignore[no-untyped-def]
    s = SHAPES["aligned"]
    _, src_kv, _ = _pages(layout, s, seed=3)
    dst_raw, _, dst_layers = _pages(layout, s, seed=4)
    geometry, flat = describe(src_kv, s.blocks)
    ids = [5, 0, 23, 11]
    staged = HostCopier(geometry, flat).gather(ids)
    hashes = [bytes([9, i]) * 16 for i in range(len(ids))]
    with manager.client() as c:
        arena = ArenaView(c, "cpu")
        engine = _engine(dst_layers, arena, kernel)
        ns = c.register_namespace(b"\x44" * 32, engine.block_bytes)
        assert c.save(ns, hashes, staged).stored == len(ids)
        dst_ids = [1, 2, 3, 4]
        expected = _expected_after_scatter(dst_raw, layout, s, staged.tobytes(), dst_ids)
        with c.lookup(ns, hashes) as lease:
            engine.load(c.acquire(lease), dst_ids)
        engine.drain()
        arena.close()
    assert torch.equal(dst_raw, expected)


def test_validation_errors_name_expected_and_actual(manager) -> None:  # type: ignore[no-untyped-def]
    s = SHAPES["aligned"]
    _, _, layers = _pages("LBHNC", s, seed=5)
    with manager.client() as c:
        arena = ArenaView(c, "cpu")
        engine = CopyEngine(layers, arena)
        seg, size = next(iter(arena.sizes.items()))
        bb = engine.block_bytes
        ok = [(seg, 0), (seg, bb)]
        with pytest.raises(ValueError, match=r"2 block ids, 1 slots"):
            engine.load(ok[:1], [0, 1])
        with pytest.raises(ValueError, match=r"1 block ids, 2 slots"):
            engine.save([0], ok)
        with pytest.raises(ValueError, match=rf"unknown arena segment 999; expected one of \[{seg}"):
            engine.load([(999, 0)], [0])
        with pytest.raises(ValueError, match=rf"offset {size - bb + 1} \+ block_bytes {bb} lies outside segment"):
            engine.load([(seg, size - bb + 1)], [0])
        with pytest.raises(ValueError, match="offset -1"):
            engine.save([0], [(seg, -1)])
        with pytest.raises(ValueError, match=rf"block id {s.blocks} \(position 1\) outside the expected range \[0, "):
            engine.load(ok, [0, s.blocks])
        with pytest.raises(ValueError, match=r"block id -1 .* outside"):
            engine.save([-1], ok[:1])
        with pytest.raises(ValueError, match=r"duplicate destination block ids \[3\]"):
            engine.load(ok, [3, 3])
        with pytest.raises(ValueError, match="overlap; expected disjoint"):
            engine.save([0, 1], [(seg, 0), (seg, bb - 1)])
        with pytest.raises(ValueError, match=r"expected \(segment, offset\), got None"):
            engine.save([0], [None])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="unknown arena segment 999"):
            arena.segment(999)
        # A valid duplicate *source* is fine: one slot loaded into two blocks, one block saved twice.
        engine.load([(seg, 0), (seg, 0)], [0, 1])
        engine.save([2, 2], ok)
        arena.close()


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_batch_over_many_segments_round_trips(kernel: str, manager_factory) -> None:  # type: ignore[no-untyped-def]
    """Slots spread over several arena segments in one batch (the Triton kernel reaches
    them all from the lowest-addressed segment), random destinations, byte-exact."""
    s = Shape(layers=2, blocks=96, heads=4, tokens=16, content=32)  # 8 KiB blocks
    m = manager_factory("--dram-size", "2MiB", "--segment-size", "256KiB")
    _, src_kv, src_layers = _pages("BLHNC", s, seed=31)
    dst_raw, _, dst_layers = _pages("BLHNC", s, seed=32)
    with m.client() as c:
        arena = ArenaView(c, "cpu")
        assert len(arena.sizes) == 8
        src, dst = _engine(src_layers, arena, kernel), _engine(dst_layers, arena, kernel)
        ns = c.register_namespace(b"\x5e" * 32, src.block_bytes)
        rng = random.Random(33)
        n = 90  # 720 KiB: at least three segments
        hashes = [rng.randbytes(32) for _ in range(n)]
        src_ids = rng.sample(range(s.blocks), n)
        with c.begin_save(ns, hashes) as pending:
            slots = pending.slots
            assert len({seg for seg, _ in slots}) >= 3, slots
            src.save(src_ids, slots).synchronize()
            c.commit_save(pending)
        dst_ids = rng.sample(range(s.blocks), n)
        with c.lookup(ns, hashes) as lease:
            assert lease.hit_blocks == n
            dst.load(c.acquire(lease), dst_ids).synchronize()
        dst_kv = kv_layouts.views(dst_raw, "BLHNC", s)
        for a, b in zip(src_ids, dst_ids, strict=True):
            assert kv_layouts.page_bytes_of(dst_kv, s, b) == kv_layouts.page_bytes_of(src_kv, s, a), (a, b)
        arena.close()


def test_checks_cover_every_range_of_a_batch(manager, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Batches split into ranges (checked one by one for loads): an error in any range is
    found, named by its position in the whole batch; slot overlaps between any two slots
    of a save, in one bucket, in neighbouring buckets, or found by the sort fallback."""
    import orbitkv.kvcopy.checks as checks_mod
    import orbitkv.kvcopy.engine as engine_mod

    s = SHAPES["aligned"]
    _, _, layers = _pages("LBHNC", s, seed=14)
    with manager.client() as c:
        arena = ArenaView(c, "cpu")
        engine = CopyEngine(layers, arena)
        bb = engine.block_bytes
        monkeypatch.setattr(engine_mod, "CHUNK_BYTES", 2 * max(p.page_bytes for p in layers))  # 2 blocks a range
        seg = next(iter(arena.sizes))
        slots = [(seg, i * bb) for i in range(8)]
        assert len(engine._batches(8)) == 4
        with pytest.raises(ValueError, match=rf"block id {s.blocks} \(position 7\) outside"):
            engine.load(slots, [0, 1, 2, 3, 4, 5, 6, s.blocks])
        with pytest.raises(ValueError, match=r"slot 6: unknown arena segment 999"):
            engine.load([*slots[:6], (999, 0), slots[7]], list(range(8)))
        with pytest.raises(ValueError, match=r"duplicate destination block ids \[1\]"):
            engine.load(slots, [0, 1, 2, 3, 4, 5, 6, 1])  # across ranges
        with pytest.raises(ValueError, match=r"duplicate destination block ids \[5\]"):
            engine.load(slots, [0, 1, 2, 3, 4, 5, 5, 7])  # inside one range
        spaced = [(seg, 2 * i * bb) for i in range(8)]
        with pytest.raises(ValueError, match=r"slot 5: offset -1 "):
            engine.save(list(range(8)), [*spaced[:5], (seg, -1), *spaced[6:]])
        with pytest.raises(ValueError, match=r"slots 4 .* and 5 .* overlap"):
            engine.save(list(range(8)), [*spaced[:5], (seg, 8 * bb + 7), *spaced[6:]])  # one bucket, one range
        with pytest.raises(ValueError, match=r"slots 2 .* and 5 .* overlap"):
            engine.save(list(range(8)), [*spaced[:5], (seg, 4 * bb + 1), *spaced[6:]])  # one bucket
        with pytest.raises(ValueError, match=r"slots 3 .* and 6 .* overlap"):
            engine.save(list(range(8)), [*spaced[:6], (seg, 6 * bb - bb // 2), spaced[7]])  # the next bucket
        engine.save(list(range(8)), [*spaced[:6], (seg, 5 * bb), spaced[7]])  # touching, not overlapping
        monkeypatch.setattr(checks_mod, "BUCKETS_PER_SLOT", 0)  # buckets outnumber slots: the sort
        with pytest.raises(ValueError, match=r"slots 1 .* and 7 .* overlap"):
            engine.save(list(range(8)), [*spaced[:7], (seg, 2 * bb + 3)])
        engine.save(list(range(8)), spaced)
        arena.close()


def test_packed_slots_round_trip_like_the_tuple_lists(manager) -> None:  # type: ignore[no-untyped-def]
    """`acquire_packed` / `packed_slots` carry the same slots as the tuple lists, and the
    engine takes them as arrays with the same checks."""
    s = SHAPES["aligned"]
    raw, _, layers = _pages("LBHNC", s, seed=11)
    with manager.client() as c:
        arena = ArenaView(c, "cpu")
        engine = CopyEngine(layers, arena)
        ns = c.register_namespace(b"\x71" * 32, engine.block_bytes)
        hashes = [bytes([i]) * 32 for i in range(4)]
        with c.begin_save(ns, hashes[:2]) as first:
            c.commit_save(first)
        pending = c.begin_save(ns, hashes)  # the first two are present: no slot
        packed = slots_array(pending.packed_slots)
        assert packed.tolist() == [[-1, -1], [-1, -1]] + [list(x) for x in pending.slots[2:]]
        engine.save([4, 5], packed[2:]).synchronize()
        c.commit_save(pending)
        lease = c.lookup(ns, hashes)
        assert lease.hit_blocks == 4
        got = slots_array(c.acquire_packed(lease))
        assert got.tolist() == [list(x) for x in c.acquire(lease)]
        _, dst_views, dst_layers = _pages("LBHNC", s, seed=12)
        loader = CopyEngine(dst_layers, arena)
        loader.load(got[2:], np.array([7, 9])).synchronize()
        c.release(lease)
        src_views = kv_layouts.views(raw, "LBHNC", s)
        for name, v in src_views.items():
            for src_b, dst_b in ((4, 7), (5, 9)):
                want = v[src_b].contiguous().view(torch.uint8)
                assert torch.equal(dst_views[name][dst_b].contiguous().view(torch.uint8), want), (name, src_b)
        with pytest.raises(ValueError, match=r"expected an \[n, 2\] integer array"):
            engine.load(np.zeros((2, 3), dtype=np.int64), [0, 1])
        with pytest.raises(ValueError, match="unknown arena segment -1"):
            engine.save([0, 1], packed[:2])
        with pytest.raises(ValueError, match="16 bytes each"):
            slots_array(b"\x00" * 15)
        arena.close()


def test_kernel_choice_is_explicit_and_refused_where_it_cannot_run(manager, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s = SHAPES["aligned"]
    _, _, layers = _pages("LBHNC", s, seed=13)
    with manager.client() as c:
        arena = ArenaView(c, "cpu")
        monkeypatch.delenv("ORBITKV_COPY_KERNEL", raising=False)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        auto = CopyEngine(layers, arena)
        assert auto.kernel == "torch" and "pages on cpu" in auto.kernel_reason
        with pytest.raises(Exception, match="triton copy kernel cannot run here: pages on cpu"):
            CopyEngine(layers, arena, kernel="triton")
        with pytest.raises(Exception, match="dma copy kernel needs CUDA pages \\(these are on cpu\\)"):
            CopyEngine(layers, arena, kernel="dma")
        monkeypatch.setenv("ORBITKV_COPY_KERNEL", "dma")  # an explicit choice through the variable too
        with pytest.raises(Exception, match="dma copy kernel needs CUDA pages"):
            CopyEngine(layers, arena)
        monkeypatch.delenv("ORBITKV_COPY_KERNEL")
        with pytest.raises(ValueError, match=r"kernel must be one of \['auto', 'torch', 'triton', 'dma'\], got 'cuda'"):
            CopyEngine(layers, arena, kernel="cuda")
        monkeypatch.setenv("ORBITKV_COPY_KERNEL", "fast")
        with pytest.raises(ValueError, match=r"\$ORBITKV_COPY_KERNEL must be one of"):
            CopyEngine(layers, arena)
        monkeypatch.setenv("ORBITKV_COPY_KERNEL", "torch")
        assert CopyEngine(layers, arena).kernel_reason.startswith("$ORBITKV_COPY_KERNEL")
        arena.close()


def test_dma_runs_join_adjacent_slots_in_batch_order() -> None:
    """The dma kernel issues one memcpy per run of slots that follow each other in the
    arena in batch order; any other order starts a new run."""
    from orbitkv.kvcopy.dma import DmaPath, slot_runs

    # the rings: 2 directions x 3 buffers of 64 MiB of whole blocks (at least one block)
    assert DmaPath.ring_bytes(2 << 20) == 384 << 20
    assert DmaPath.ring_bytes(100 << 20) == 6 * (100 << 20)
    assert DmaPath.ring_bytes(3 << 20) == 6 * 21 * (3 << 20)

    bb = 1 << 20
    addrs = np.array([0, bb, 2 * bb, 10 * bb, 9 * bb, 11 * bb, 12 * bb, 12 * bb + 8], dtype=np.int64)
    starts, lengths = slot_runs(addrs, bb)
    assert starts.tolist() == [0, 3, 4, 5, 7] and lengths.tolist() == [3, 1, 1, 2, 1]
    assert int(lengths.sum()) == addrs.size
    one, n = slot_runs(np.array([5 * bb]), bb)
    assert one.tolist() == [0] and n.tolist() == [1]
    empty, m = slot_runs(np.empty(0, dtype=np.int64), bb)
    assert empty.size == 0 and m.size == 0


def test_triton_warm_up_launch_moves_nothing() -> None:
    """The launches `CopyEngine()` makes to compile the one-pass kernels copy nothing."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernel runs on CPU pages only under TRITON_INTERPRET=1 (scripts/test.sh sets it)")
    pytest.importorskip("triton", reason="triton is not installed in this environment")
    from orbitkv.kvcopy import triton_copy
    from orbitkv.kvcopy.runs import page_runs

    arena = torch.arange(512, dtype=torch.int64)
    pages = -torch.arange(512, dtype=torch.int64)
    before_a, before_p = arena.clone(), pages.clone()
    runs = page_runs((2, 16, 64), (2048, 64, 1), 8)
    assert runs is not None
    index = torch.zeros(1, dtype=torch.int64)
    for to_pages in (True, False):
        triton_copy.copy_runs(
            arena,
            pages,
            index,
            index,
            layer_off=0,
            page_base=0,
            block_stride=2048,
            runs=runs,
            elem=8,
            to_pages=to_pages,
            warm_up=True,
        )
    assert torch.equal(arena, before_a) and torch.equal(pages, before_p)
    triton_copy.copy_runs(
        arena, pages, index, index, layer_off=0, page_base=0, block_stride=2048, runs=runs, elem=8, to_pages=True
    )  # the same call without warm_up copies block 0:
    # its page is two runs of 128 elements (K and V planes 256 elements apart)
    assert torch.equal(pages[:128], arena[:128]) and torch.equal(pages[256:384], arena[128:256])
    assert torch.equal(pages[128:256], before_p[128:256]) and torch.equal(pages[384:], before_p[384:])


def test_page_runs_merge_dims_and_refuse_what_the_kernel_cannot_walk() -> None:
    from orbitkv.kvcopy.runs import page_runs

    r = page_runs((4096,), (1,), 8)  # one dense page
    assert r is not None and (r.sizes, r.strides, r.run, r.count) == ((1, 1, 1), (0, 0, 0), 512, 1)
    r = page_runs((2, 16, 256), (1 << 20, 256, 1), 8)  # K and V planes: [16, 256] dense inside each
    assert r is not None and (r.sizes, r.strides, r.run) == ((1, 1, 2), (0, 0, 1 << 17), 512)
    r = page_runs((4, 16, 64), (64, 4 * 64 * 99, 1), 4)  # heads inside tokens, strided tokens
    assert r is not None and (r.sizes, r.strides, r.run) == ((1, 4, 16), (0, 16, 99 * 64), 16)
    assert page_runs((16, 64), (64, 2), 1) is None  # last dim not dense
    assert page_runs((2, 3, 5, 7, 8), (10**6, 10**5, 10**4, 10**3, 1), 8) is None  # four outer dims
    assert page_runs((6,), (1,), 4) is None  # the run is not whole elements
    assert page_runs((70000, 8), (16, 1), 8) is None  # more runs than a grid dimension takes


def test_layer_pages_validate_their_geometry() -> None:
    backing = torch.zeros(4096, dtype=torch.uint8)
    with pytest.raises(ValueError, match="page_bytes is 100, expected the product"):
        LayerPages(backing, 0, 1024, (4, 64), (64, 1), 100)
    with pytest.raises(ValueError, match="5 blocks reach past the 4096-byte backing"):
        LayerPages(backing, 0, 1024, (4, 64), (64, 1), 256, num_blocks=5)
    with pytest.raises(ValueError, match="contiguous 1-D uint8"):
        LayerPages(backing.view(torch.int32), 0, 1024, (4, 64), (64, 1), 256)
    assert LayerPages(backing, 0, 1024, (4, 64), (64, 1), 256).blocks == 4
