"""The worker on `orbitkv.kvcopy` (`orbitkv.copy_engine = "torch"`) under the released
vLLM 0.31.0 Scheduler, on CPU pages, against a real Manager process.

This is the asynchronous protocol of the CUDA path (loads reported once their copy
completed, saves committed after the step, delayed block frees through
`request_finished` -> `finished_sending`), with the copy engine's CPU implementation.
Completion is deferred by fault injection *around* the real engine: the engine copies,
and a wrapper keeps the handle's `query()` False (or makes it raise) until the test
releases it, which is exactly what a CUDA copy still in flight (or failed) looks like
to the worker.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

from pathlib import Path
from typing import Any

import pytest
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens

from orbitkv.vllm.metadata import OrbitKVConnectorMetadata

pytestmark = [pytest.mark.vllm, pytest.mark.native]

PROMPT = prompt_tokens(100, seed=11)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK
TORCH = {"orbitkv.copy_engine": "torch"}
LAYOUTS = ["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]


@pytest.fixture
def manager(orbit_manager: ManagerProcess) -> ManagerProcess:
    return orbit_manager


def build(model_dir: Path, manager: ManagerProcess, *, extra: dict[str, Any] | None = None, **kw: Any) -> Engine:
    cfg = make_vllm_config(model_dir, socket_path=str(manager.socket_path), extra=dict(TORCH, **(extra or {})), **kw)
    e = Engine.build(cfg)
    assert e.worker.kvcopy and e.connector.scheduler_side.async_saves
    assert e.worker.worker_side.engine is not None, "the copy engine is built at registration"
    return e


def counters(e: Engine) -> dict[str, int]:
    return dict(e.connector.scheduler_side.counters)


def prefill_done(e: Engine, req_id: str, n: int):  # type: ignore[no-untyped-def]
    def pred() -> bool:
        r = e.scheduler.requests.get(req_id)
        return r is not None and r.status == RequestStatus.RUNNING and r.num_computed_tokens >= n

    return pred


def assert_drained_no_leases_held(e: Engine, manager: ManagerProcess) -> None:
    e.assert_drained()
    c = counters(e)
    assert c["leases_released"] + c["leases_lost_with_session"] == c["lookups"], c
    manager.settled_stats(live_leases=0, live_saves=0)


def visible_blocks(e: Engine, prompt: list[int]) -> int:
    """How many leading blocks of `prompt` a lookup hits in the Manager right now."""
    r = make_request(prompt)
    session = e.worker.worker_side.session
    lease = session.client().lookup(session.namespace(b""), list(r.block_hashes))
    try:
        return int(lease.hit_blocks)
    finally:
        session.client().release(lease)


class Gate:
    """Defers (or fails) the completion of copies the real engine issued."""

    def __init__(self, engine: Any, method: str, *, fail: bool = False) -> None:
        """Gate the copies `engine.method` issues from now on (failing them, with `fail`)."""
        self.open = False
        self.fail = fail
        self.issued = 0
        self.wrap(engine, method)

    def wrap(self, engine: Any, method: str) -> None:
        real = getattr(engine, method)
        gate = self

        class Handle:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def query(self) -> bool:
                if gate.fail:
                    raise RuntimeError("injected copy failure")
                return gate.open and bool(self.inner.query())

            def wait_layer(self, i: int, stream: Any = None) -> None:
                self.inner.wait_layer(i, stream)

        def issue(*args: Any, **kwargs: Any) -> Any:
            gate.issued += 1
            return Handle(real(*args, **kwargs))

        setattr(engine, method, issue)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cold_miss_save_then_full_hit_byte_exact(model_dir: Path, manager: ManagerProcess, layout: str) -> None:
    a = build(model_dir, manager, layout=layout)
    r = make_request(PROMPT)
    a.scheduler.add_request(r)
    a.run_to_completion([r.request_id])
    a.run_until_drained()
    c = counters(a)
    assert (c["lookups"], c["presence_misses"], c["hit_blocks"], c["loads_started"]) == (0, 1, 0, 0)
    assert c["saved_blocks"] >= FULL_BLOCKS and c["failed_saves"] == 0, c
    assert c["delayed_frees"] == 1, "the finish waited for the asynchronous saves"
    assert_drained_no_leases_held(a, manager)

    # A fresh engine (no HBM state) restores the whole prefix through the copy engine.
    b = build(model_dir, manager, layout=layout)
    r2 = b.submit(PROMPT)
    so = b.schedule_admitting(r2)
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata) and [len(s.block_ids) for s in meta.loads] == [FULL_BLOCKS]
    b.execute(so)
    b.run_until(prefill_done(b, r2.request_id, len(PROMPT)), what="prefill after load")
    b.check_pages(r2, len(PROMPT))
    assert b.worker.worker_side.counters["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
    b.run_to_completion([r2.request_id])
    b.run_until_drained()
    assert (counters(b)["hit_blocks"], counters(b)["loads_finished"]) == (FULL_BLOCKS, 1)
    assert_drained_no_leases_held(b, manager)

    # The slot format is the native path's: a native-copy engine restores it byte-exact.
    n = Engine.build(make_vllm_config(model_dir, socket_path=str(manager.socket_path), layout=layout))
    assert not n.worker.kvcopy
    r3 = make_request(PROMPT)
    n.scheduler.add_request(r3)
    n.run_until(prefill_done(n, r3.request_id, len(PROMPT)), what="native prefill after load")
    n.check_pages(r3, len(PROMPT))
    n.run_to_completion([r3.request_id])
    n.assert_drained()
    for e in (a, b, n):
        e.shutdown()


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
def test_layers_in_storages_of_their_own_share_blocks_with_one_allocation(
    model_dir: Path, manager: ManagerProcess, layout: str
) -> None:
    """vLLM 0.34's extensible KV cache registers each layer over a storage of its own (its
    committed segment of one reservation). Blocks saved from one allocation load into such
    pages byte-exact, and blocks they save load into one allocation byte-exact."""
    a = build(model_dir, manager, layout=layout)
    r = make_request(PROMPT)
    a.scheduler.add_request(r)
    a.run_to_completion([r.request_id])
    a.run_until_drained()

    cfg = make_vllm_config(model_dir, socket_path=str(manager.socket_path), extra=TORCH, layout=layout)
    b = Engine.build(cfg, per_layer_storages=True)
    assert b.worker.kvcopy and len({t.untyped_storage().data_ptr() for t in b.kv_caches.values()}) > 1
    r2 = b.submit(PROMPT)
    b.run_until(prefill_done(b, r2.request_id, len(PROMPT)), what="prefill after load into per-layer storages")
    b.check_pages(r2, len(PROMPT))
    other = prompt_tokens(70, seed=12)
    r3 = b.submit(other)
    b.run_to_completion([r2.request_id, r3.request_id])
    b.run_until_drained()
    assert counters(b)["hit_blocks"] == FULL_BLOCKS and counters(b)["failed_saves"] == 0
    assert_drained_no_leases_held(b, manager)

    c = build(model_dir, manager, layout=layout)
    r4 = c.submit(other)
    c.run_until(prefill_done(c, r4.request_id, len(other)), what="prefill after load from per-layer storages")
    c.check_pages(r4, len(other))
    assert counters(c)["hit_blocks"] == len(other) // BLOCK
    c.run_to_completion([r4.request_id])
    c.run_until_drained()
    for e in (a, b, c):
        e.shutdown()


def test_triton_kernel_on_cpu_pages_is_refused_at_registration_naming_the_setting(
    model_dir: Path, orbit_manager: ManagerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = make_vllm_config(
        model_dir, socket_path=str(orbit_manager.socket_path), extra=dict(TORCH, **{"orbitkv.copy_kernel": "triton"})
    )
    refused = r"triton copy kernel cannot run here: pages on cpu.*orbitkv.copy_kernel = 'triton'"
    with pytest.raises(Exception, match=refused):
        Engine.build(cfg)
    e = build(model_dir, orbit_manager, extra={"orbitkv.copy_kernel": "auto"})  # auto: torch on CPU pages
    assert e.worker.worker_side.engine is not None and e.worker.worker_side.engine.kernel == "torch"
    e.shutdown()


def test_async_save_holds_blocks_until_the_copy_completes(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    gate = Gate(a.worker.worker_side.engine, "save")
    r = a.submit(PROMPT)
    steps = a.run_to_completion([r.request_id])
    assert gate.issued >= 1
    # The request finished, but its copies have not completed: vLLM keeps its blocks
    # (request_finished returned True) and nothing is visible in the Manager (L4).
    side = a.connector.scheduler_side
    assert r.request_id in a.scheduler.requests and side.sending_requests == 1
    pool = a.scheduler.kv_cache_manager.block_pool
    held = pool.num_gpu_blocks - 1 - pool.free_block_queue.num_free_blocks
    assert held >= FULL_BLOCKS
    for _ in range(5):  # more steps: still not reported, still held, still invisible
        steps.append(a.step())
        assert r.request_id in a.scheduler.requests
    assert not any(r.request_id in (s.kv_output.finished_sending or ()) for s in steps)
    stats = manager.stats()
    assert stats["blocks_committed_total"] == 0 and stats["live_saves"] >= 1, stats
    assert visible_blocks(a, PROMPT) == 0
    assert counters(a)["saved_blocks"] == 0

    gate.open = True
    after = a.run_until_drained()
    sent = [s for s in after if r.request_id in (s.kv_output.finished_sending or ())]
    assert len(sent) == 1, "reported in finished_sending exactly once, after completion"
    assert counters(a)["saved_blocks"] >= FULL_BLOCKS
    assert visible_blocks(a, PROMPT) == FULL_BLOCKS
    assert_drained_no_leases_held(a, manager)
    a.shutdown()


def test_failed_copy_is_aborted_never_visible_and_the_request_finishes(
    model_dir: Path, manager: ManagerProcess
) -> None:
    a = build(model_dir, manager)
    gate = Gate(a.worker.worker_side.engine, "save", fail=True)
    r = a.submit(PROMPT)
    a.run_to_completion([r.request_id])
    a.run_until_drained()
    assert gate.issued >= 1 and r.request_id in a.finished and r.request_id not in a.failed
    c = counters(a)
    assert c["failed_saves"] >= 1 and c["saved_blocks"] == 0, c
    stats = manager.stats()
    assert stats["blocks_committed_total"] == 0 and stats["dram_pending_save_bytes"] == 0, stats
    assert visible_blocks(a, PROMPT) == 0
    assert_drained_no_leases_held(a, manager)
    a.shutdown()


def test_deferred_load_is_reported_only_after_completion_and_keeps_its_lease(
    model_dir: Path, manager: ManagerProcess
) -> None:
    a = build(model_dir, manager)
    a.scheduler.add_request(make_request(PROMPT))
    a.run_until_drained()
    b = build(model_dir, manager)
    worker = b.worker.worker_side
    gate = Gate(worker.engine, "load")
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    b.run_until(lambda: gate.issued == 1, what="the load's copy issued")
    ld = worker._kv_loads[r.request_id]
    assert ld.acquired is not None and ld.acquired.lease is not None
    lease = ld.acquired.lease
    for _ in range(5):
        res = b.step()
        assert r.request_id not in (res.kv_output.finished_recving or ())
        assert b.status(r.request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS
    # The worker's load lease and the scheduler's query lease both still pin the sources.
    assert not lease.released and manager.stats()["live_leases"] == 2
    gate.open = True
    b.run_until(prefill_done(b, r.request_id, len(PROMPT)), what="prefill after the deferred load")
    assert lease.released
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    b.run_until_drained()
    assert_drained_no_leases_held(b, manager)
    for e in (a, b):
        e.shutdown()


def test_shutdown_drains_copies_before_closing_the_session(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    worker = a.worker.worker_side
    gate = Gate(worker.engine, "save")
    r = make_request(PROMPT)
    a.scheduler.add_request(r)
    a.run_to_completion([r.request_id])
    assert worker._kv_saves, "saves in flight at shutdown"
    order: list[str] = []
    real_drain, real_close = worker.engine.drain, worker.session.close

    def drain() -> None:
        order.append("drain")
        real_drain()
        gate.open = True  # the drain waited for every copy: the handles complete

    def close() -> None:
        order.append("close")
        real_close()

    worker.engine.drain = drain  # type: ignore[method-assign]
    worker.session.close = close  # type: ignore[method-assign]
    worker.shutdown()
    assert order == ["drain", "close"]
    assert not worker._kv_saves
    stats = manager.stats()
    assert stats["blocks_committed_total"] >= FULL_BLOCKS and stats["live_saves"] == 0, stats
    a.connector.shutdown()
    other = build(model_dir, manager)
    assert visible_blocks(other, PROMPT) == FULL_BLOCKS
    other.shutdown()


def test_preempted_request_with_saves_in_flight_resumes_and_drains(model_dir: Path, manager: ManagerProcess) -> None:
    """Preemption while saves are still copying: the saves no longer hold the request
    (both roles drop it in the same order), they still commit, and the resumed request
    finishes with its own saves' delayed free."""
    a = build(model_dir, manager)
    gate = Gate(a.worker.worker_side.engine, "save")
    r = make_request(PROMPT, max_tokens=24)
    a.scheduler.add_request(r)
    a.run_until(lambda: len(r.output_token_ids) >= 8, what="decode progress")
    assert a.worker.worker_side._kv_saves, "saves still copying"
    assert a.scheduler.reset_prefix_cache(reset_running_requests=True)
    assert r.status == RequestStatus.PREEMPTED
    res = a.step()
    assert r.request_id in (res.scheduler_output.preempted_req_ids or set())
    assert r.request_id not in a.worker.worker_side._save_reqs
    gate.open = True
    a.run_to_completion([r.request_id])
    a.run_until_drained()
    assert counters(a)["saved_blocks"] >= FULL_BLOCKS
    assert_drained_no_leases_held(a, manager)
    a.shutdown()
