"""The copy engine on CUDA pages (the H200 GPU machine; see README.md here): byte-exact
round trips for every vLLM 0.31.0 layout, pinning once per process, ordering races
for loads and saves, and a CUDA graph replayed after a restore. Skipped, with the
reason, where torch or CUDA is unavailable."""

from __future__ import annotations

import contextlib
import random
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available on this machine (no GPU or a CPU-only torch)", allow_module_level=True)

import kv_layouts  # noqa: E402
import numpy as np  # noqa: E402
from host_copier import HostCopier  # noqa: E402
from kv_layouts import LAYOUTS, Shape  # noqa: E402

from orbitkv.kvcopy import ArenaView, CopyEngine, layer_pages, pinned_segments  # noqa: E402
from orbitkv.vllm.layout import describe  # noqa: E402

pytestmark = pytest.mark.native
DEV = torch.device("cuda", torch.cuda.current_device())
SHAPES = {
    "aligned": Shape(layers=3, blocks=24, heads=4, tokens=16, content=32),
    "odd": Shape(layers=2, blocks=17, heads=3, tokens=5, content=6, dtype=torch.float16, pad=6),
}
# 32 layers x 64 KiB pages (Llama-3-8B-like), 512 blocks restored per repetition: 1 GiB.
BIG = Shape(layers=32, blocks=768, heads=8, tokens=16, content=128, dtype=torch.bfloat16, pad=0)
BIG_N = 512
REPS = 100


def _oracle_scatter(raw_cpu: torch.Tensor, layout: str, s: Shape, staged: bytes, ids: list[int]) -> torch.Tensor:
    out = raw_cpu.clone()
    geometry, flat = describe(kv_layouts.views(out, layout, s), s.blocks)
    HostCopier(geometry, flat).scatter(np.frombuffer(staged, dtype=np.uint8), ids)
    return out


def _wait(pred, what: str, deadline_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.0005)


@contextlib.contextmanager
def _client_and_arena(m):  # type: ignore[no-untyped-def]
    """A client of Manager `m` and its arena on the device, both closed on leaving."""
    c = m.client()
    arena = ArenaView(c, DEV)
    try:
        yield c, arena
    finally:
        arena.close()
        c.close()


@pytest.mark.parametrize(("layout", "shape"), [(lay, sh) for lay in LAYOUTS for sh in SHAPES])
def test_cuda_round_trip_matches_the_host_oracle(layout: str, shape: str, manager) -> None:  # type: ignore[no-untyped-def]
    s = SHAPES[shape]
    rng = random.Random(f"cuda-{layout}-{shape}")
    src_cpu = kv_layouts.random_backing(s, 11)
    dst_cpu = kv_layouts.random_backing(s, 12)
    src_raw, dst_raw = src_cpu.to(DEV), dst_cpu.to(DEV)
    with _client_and_arena(manager) as (c, arena):
        src = CopyEngine(layer_pages(kv_layouts.views(src_raw, layout, s), s.blocks), arena)
        dst = CopyEngine(layer_pages(kv_layouts.views(dst_raw, layout, s), s.blocks), arena)
        n = 7
        ids = rng.sample(range(s.blocks), n)
        hashes = [rng.randbytes(32) for _ in range(n)]
        geometry, flat = describe(kv_layouts.views(src_cpu, layout, s), s.blocks)
        oracle = HostCopier(geometry, flat).gather(ids).tobytes()
        ns = c.register_namespace(b"\x61" * 32, src.block_bytes)
        with c.begin_save(ns, hashes) as pending:
            h = src.save(ids, pending.slots)
            h.synchronize()
            assert h.query()
            c.commit_save(pending)
        staged = bytearray(n * src.block_bytes)
        with c.lookup(ns, hashes) as lease:
            c.restore(lease, staged)
            assert bytes(staged) == oracle, f"{layout}/{shape}: CUDA slot bytes differ from HostCopier.gather_to"
            dst_ids = rng.sample(range(s.blocks), n - 2)
            load = dst.load(c.acquire(lease)[2:], dst_ids)
            for i in range(s.layers):
                load.wait_layer(i)
            load.synchronize()
            assert load.query()
        expected = _oracle_scatter(dst_cpu, layout, s, oracle[2 * src.block_bytes :], dst_ids)
        assert torch.equal(dst_raw.cpu(), expected), f"{layout}/{shape}: restored pages or sentinels differ"
        assert torch.equal(src_raw.cpu(), src_cpu), "a save wrote to its source pages"
        src.drain()
        dst.drain()


def test_segments_are_pinned_once_per_process_and_unpinned_by_the_last_view(manager) -> None:  # type: ignore[no-untyped-def]
    with manager.client() as c:
        first: list[str] = []
        second: list[str] = []
        a = ArenaView(c, DEV, progress=first.append)
        addrs = {c.segment_address(seg)[0] for seg, _ in c.segments()}
        assert len(first) == len(addrs) and all("pinned arena segment" in m and " s" in m for m in first)
        assert {a: u for a, (_, u) in pinned_segments().items() if a in addrs} == dict.fromkeys(addrs, 1)
        b = ArenaView(c, DEV, progress=second.append)
        assert len(second) == len(addrs) and all("already pinned" in m for m in second)
        assert {a: u for a, (_, u) in pinned_segments().items() if a in addrs} == dict.fromkeys(addrs, 2)
        seg = next(iter(a.sizes))
        t = a.segment(seg)
        assert t.device == DEV
        # The CUDA tensor and a CPU view see the same host bytes (zero copy, UVA).
        cpu_view = ArenaView(c, "cpu")
        cpu = cpu_view.segment(seg)
        cpu[:4096] = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
        assert torch.equal(t[:4096].cpu(), cpu[:4096])
        t[4096:8192].fill_(7)
        torch.cuda.synchronize()
        assert bool((cpu[4096:8192] == 7).all())
        cpu_view.close()
        a.close()
        assert all(pinned_segments()[x][1] == 1 for x in addrs)
        b.close()
        assert not addrs & set(pinned_segments())


def _big(manager_factory):  # type: ignore[no-untyped-def]
    """`_client_and_arena` on a Manager with 1.5 GiB of DRAM in 512 MiB segments."""
    return _client_and_arena(manager_factory("--dram-size", "1536MiB", "--segment-size", "512MiB"))


def _zeroed_engine(arena, s: Shape):  # type: ignore[no-untyped-def]
    """Zeroed LBNHC pages of shape `s` on the device, and a copy engine over them."""
    raw = torch.zeros(kv_layouts.total_bytes(s), dtype=torch.uint8, device=DEV)
    return raw, CopyEngine(layer_pages(kv_layouts.views(raw, "LBNHC", s), s.blocks), arena)


def _pending_save(c, arena, engine, seed: int, tag: bytes):  # type: ignore[no-untyped-def]
    """`random.Random(seed)`, then a save of BIG_N random hashes begun in namespace `tag`:
    returns the rng, the pending save, its slots and each slot's bytes in the arena."""
    rng = random.Random(seed)
    ns = c.register_namespace(tag * 32, engine.block_bytes)
    pending = c.begin_save(ns, [rng.randbytes(32) for _ in range(BIG_N)])
    slots = pending.slots
    slot_bytes = [arena.segment(seg)[off : off + engine.block_bytes] for seg, off in slots]
    return rng, pending, slots, slot_bytes


def _slots_not_holding(slot_bytes, value: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Indices of the slots whose bytes are not all `value`."""
    ok = torch.stack([(t == value).all() for t in slot_bytes])
    return (~ok).nonzero().flatten().tolist()


def test_restores_consumed_right_after_wait_layer_see_the_restored_bytes(manager_factory) -> None:  # type: ignore[no-untyped-def]
    s = BIG
    with _big(manager_factory) as (c, arena):
        src_raw = kv_layouts.random_backing(s, 21, DEV)
        dst_raw = torch.zeros_like(src_raw)
        src = CopyEngine(layer_pages(kv_layouts.views(src_raw, "LBNHC", s), s.blocks), arena)
        dst_views = kv_layouts.views(dst_raw, "LBNHC", s)
        dst = CopyEngine(layer_pages(dst_views, s.blocks), arena)
        rng = random.Random(5)
        src_ids = rng.sample(range(s.blocks), BIG_N)
        ns = c.register_namespace(b"\x62" * 32, src.block_bytes)
        pending = c.begin_save(ns, [rng.randbytes(32) for _ in range(BIG_N)])
        slots = pending.slots
        src.save(src_ids, slots).synchronize()
        src_views = kv_layouts.views(src_raw, "LBNHC", s)
        src_idx = torch.tensor(src_ids, device=DEV)
        expected = torch.stack([v[src_idx].view(torch.int64).sum() for v in src_views.values()])
        for rep in range(REPS):
            dst_ids = rng.sample(range(s.blocks), BIG_N)
            dst_idx = torch.tensor(dst_ids, device=DEV)
            dst_raw.zero_()  # on the current stream; the load is ordered after it
            load = dst.load(slots, dst_ids)
            sums = []
            for i, v in enumerate(dst_views.values()):
                load.wait_layer(i)  # then immediately consume layer i on the current stream
                sums.append(v[dst_idx].view(torch.int64).sum())
            got = torch.stack(sums)
            assert torch.equal(got, expected), f"rep {rep}: layers {(got != expected).nonzero().flatten().tolist()}"
            _wait(load.query, "the load to complete")
        c.abort_save(pending)
        dst.drain()
        src.drain()


def test_a_load_failing_its_check_in_a_later_range_leaves_no_copy_in_flight(manager_factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Loads are checked range by range while earlier ranges copy; an error found late
    raises only after the copies already issued completed (the caller then releases its
    lease and reuses the pages)."""
    import orbitkv.kvcopy.engine as engine_mod

    s = BIG
    with _big(manager_factory) as (_c, arena):
        _raw, engine = _zeroed_engine(arena, s)
        monkeypatch.setattr(engine_mod, "CHUNK_BYTES", 64 * engine._layers[0].pages.page_bytes)  # 64-block ranges
        seg = min(arena.sizes)
        slots = [(seg, i * engine.block_bytes) for i in range(BIG_N)]
        ids = list(range(BIG_N))
        ids[-1] = s.blocks  # out of range, in the last of 8 ranges
        torch.cuda.synchronize()
        free_before = len(engine._free_events)
        with pytest.raises(ValueError, match=rf"block id {s.blocks} \(position {BIG_N - 1}\) outside"):
            engine.load(slots, ids)
        assert engine.load_stream.query() and engine.place_stream.query(), "a copy outlived the failed load"
        assert len(engine._free_events) >= free_before, "the failed load's events did not return to the pool"
        ids[-1] = BIG_N - 1
        engine.load(slots, ids).synchronize()  # the engine still works
        engine.drain()


def test_saves_see_writes_before_their_event_and_not_writes_after_completion(manager_factory) -> None:  # type: ignore[no-untyped-def]
    s = BIG
    with _big(manager_factory) as (c, arena):
        raw, engine = _zeroed_engine(arena, s)
        rng, pending, slots, slot_bytes = _pending_save(c, arena, engine, 6, b"\x63")
        busy = getattr(torch.cuda, "_sleep", None)
        for rep in range(REPS):
            value = rep % 120 + 1
            ids = rng.sample(range(s.blocks), BIG_N)
            if busy is not None:
                busy(2_000_000)  # keep the current stream busy so an unordered save would read stale pages
            raw.fill_(value)  # the "forward" writes the pages ...
            written = torch.cuda.Event()
            written.record()  # ... and records the event the save is ordered after; no host sync
            handle = engine.save(ids, slots, after=written)
            _wait(handle.query, "the save to complete")
            raw.fill_(value + 128)  # overwrite only once the save completed
            torch.cuda.synchronize()
            bad = _slots_not_holding(slot_bytes, value)
            assert not bad, f"rep {rep}: slots {bad[:8]} do not hold the bytes written before the event"
        c.abort_save(pending)
        engine.drain()


def test_wait_saves_orders_a_page_overwrite_after_the_saves_read(manager_factory) -> None:  # type: ignore[no-untyped-def]
    """vLLM preemption: pages are reused at once while a save may still read them.
    `wait_saves()` on the current stream must put the overwrite after the save's reads,
    with no host synchronisation, even when the save itself waits on a slow event."""
    busy = getattr(torch.cuda, "_sleep", None)
    if busy is None:
        pytest.skip("torch.cuda._sleep is not available: cannot hold a save back deterministically")
    s = BIG
    with _big(manager_factory) as (c, arena):
        raw, engine = _zeroed_engine(arena, s)
        rng, pending, slots, slot_bytes = _pending_save(c, arena, engine, 8, b"\x65")
        slow = torch.cuda.Stream()
        for rep in range(10):
            value = rep + 1
            ids = rng.sample(range(s.blocks), BIG_N)
            raw.fill_(value)
            written = torch.cuda.Event()
            slow.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(slow):
                busy(50_000_000)  # the save's "after" event comes late
                written.record(slow)
            handle = engine.save(ids, slots, after=written)
            engine.wait_saves()  # the page reuse below must wait for the save's reads
            raw.fill_(value + 100)  # the "next forward" overwrites the pages at once
            torch.cuda.synchronize()
            assert handle.query()
            bad = _slots_not_holding(slot_bytes, value)
            assert not bad, f"rep {rep}: slots {bad[:8]} read pages overwritten after wait_saves"
        c.abort_save(pending)
        engine.drain()


def test_a_graph_captured_before_a_restore_reads_the_restored_bytes(manager_factory) -> None:  # type: ignore[no-untyped-def]
    s = Shape(layers=4, blocks=64, heads=8, tokens=16, content=128, pad=0)
    with _big(manager_factory) as (c, arena):
        src_raw = kv_layouts.random_backing(s, 31, DEV)
        dst_raw = torch.zeros_like(src_raw)
        src = CopyEngine(layer_pages(kv_layouts.views(src_raw, "BLHNC", s), s.blocks), arena)
        dst_views = list(kv_layouts.views(dst_raw, "BLHNC", s).values())
        dst = CopyEngine(layer_pages(kv_layouts.views(dst_raw, "BLHNC", s), s.blocks), arena)  # events made here
        ids = list(range(0, 64, 2))
        idx = torch.tensor(ids, device=DEV)
        out = torch.zeros(s.layers, len(ids), *dst_views[0].shape[1:], dtype=dst_views[0].dtype, device=DEV)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up the kernels outside capture
            for i, v in enumerate(dst_views):
                out[i].copy_(v[idx])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i, v in enumerate(dst_views):
                out[i].copy_(v[idx])
        ns = c.register_namespace(b"\x64" * 32, src.block_bytes)
        rng = random.Random(7)
        for rep in range(10):
            src_raw.random_(0, 256)
            pending = c.begin_save(ns, [rng.randbytes(32) for _ in range(len(ids))])
            src_ids = rng.sample(range(s.blocks), len(ids))
            src.save(src_ids, pending.slots).synchronize()
            dst_raw.zero_()
            load = dst.load(pending.slots, ids)
            replay = torch.cuda.Stream()
            for i in range(s.layers):
                load.wait_layer(i, stream=replay)
            with torch.cuda.stream(replay):
                graph.replay()
            replay.synchronize()
            src_views = list(kv_layouts.views(src_raw, "BLHNC", s).values())
            want = torch.stack([v[torch.tensor(src_ids, device=DEV)] for v in src_views])
            # compare bytes: random bytes as bf16 include NaNs, which never compare equal
            assert torch.equal(out.view(torch.int16), want.view(torch.int16)), f"rep {rep}: the graph read stale pages"
            c.abort_save(pending)
        dst.drain()
        src.drain()
