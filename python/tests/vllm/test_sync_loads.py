"""`orbitkv.load_mode = "sync"` through the released Scheduler and a real Manager.

A hit held wholly in DRAM is answered `load_async=False`: vLLM schedules the request in
the step that admits it (no `WAITING_FOR_REMOTE_KVS` step), the worker loads before
that step's forward, and the first token comes out of that same step. Checked on both
worker copy paths (the native client, and `orbitkv.kvcopy` on CPU pages): byte-exact
pages, a load that fails recomputed in place, a hit with blocks on SSD still loaded
asynchronously, and no request, block, lease or save left behind.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import os
import signal
import time
from pathlib import Path

import pytest
from engine_manager import manager_in_short_dir
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens, stop_all_threads

from orbitkv.vllm.metadata import OrbitKVConnectorMetadata

pytestmark = [pytest.mark.vllm, pytest.mark.native]

PROMPT = prompt_tokens(100, seed=5)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK
SYNC = {"orbitkv.load_mode": "sync"}
COPY_PATHS = {"native": {}, "kvcopy": {"orbitkv.copy_engine": "torch"}}


def build(model_dir: Path, manager: ManagerProcess, copy: str, **kw) -> Engine:  # type: ignore[no-untyped-def]
    extra = {**SYNC, **COPY_PATHS[copy], **kw.pop("extra", {})}
    return Engine.build(make_vllm_config(model_dir, socket_path=str(manager.socket_path), extra=extra, **kw))


def counters(engine: Engine) -> dict[str, int]:
    return dict(engine.connector.scheduler_side.counters)


def save_prompt(engine: Engine) -> None:
    r = make_request(PROMPT)
    engine.scheduler.add_request(r)
    engine.run_to_completion([r.request_id])
    assert counters(engine)["saved_blocks"] >= FULL_BLOCKS
    engine.run_until_drained()


def assert_nothing_left(engine: Engine, manager: ManagerProcess) -> None:
    engine.run_until_drained()  # finished requests whose saves still copy (kvcopy) included
    engine.assert_drained()
    c = counters(engine)
    assert c["leases_released"] + c["leases_lost_with_session"] == c["lookups"], c
    manager.settled_stats(live_leases=0, live_saves=0)


def saved_then_admitted(model_dir: Path, manager: ManagerProcess, copy: str, **kw):  # type: ignore[no-untyped-def]
    """Engine `a` computes and saves PROMPT; a fresh engine `b` is given it and schedules
    until it is admitted: it must run at once, loading its hit in step."""
    a = build(model_dir, manager, copy)
    save_prompt(a)
    engine = build(model_dir, manager, copy, **kw)
    r = make_request(PROMPT)
    engine.scheduler.add_request(r)
    so = engine.schedule_admitting(r)
    assert r.status == RequestStatus.RUNNING, "an in-step load never parks the request"
    assert so.has_sync_kv_loads
    assert so.num_scheduled_tokens[r.request_id] == len(PROMPT) - FULL_BLOCKS * BLOCK
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata)
    assert [(spec.sync, len(spec.block_ids)) for spec in meta.loads] == [(True, FULL_BLOCKS)]
    return a, engine, r, so, meta.loads[0]


@pytest.mark.parametrize("copy", list(COPY_PATHS))
def test_a_dram_hit_loads_inside_the_step_that_uses_it(
    model_dir: Path, orbit_manager: ManagerProcess, copy: str
) -> None:
    a, b, r, so, _ = saved_then_admitted(model_dir, orbit_manager, copy)
    res = b.execute(so)
    # One step: 96 restored tokens, 4 computed, and the first token sampled.
    b.check_pages(r, len(PROMPT))
    assert r.num_computed_tokens == len(PROMPT) and len(r.output_token_ids) == 1
    assert not res.kv_output.invalid_block_ids and not res.kv_output.finished_recving
    c = counters(b)
    assert (c["lookups"], c["sync_loads"], c["loads_finished"], c["loads_failed"]) == (1, 1, 1, 0)
    assert b.worker.worker_side.counters["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed
    assert_nothing_left(b, orbit_manager)
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("copy", list(COPY_PATHS))
def test_an_in_step_load_that_fails_is_recomputed_in_place(
    model_dir: Path, orbit_manager: ManagerProcess, copy: str
) -> None:
    a, b, r, so, spec = saved_then_admitted(model_dir, orbit_manager, copy)
    # The lookup pinned the hit; the worker's own acquire, just before the forward, fails.
    with orbit_manager.client() as c:
        c.inject_faults(restore_failures=1)
    res = b.execute(so)
    assert res.kv_output.invalid_block_ids == set(spec.block_ids)
    assert not res.kv_output.finished_recving and not res.kv_output.failed_recving
    # vLLM rewound the request to its first bad block and dropped the step's sample.
    assert r.num_computed_tokens == 0 and not r.output_token_ids
    b.run_until(lambda: r.num_computed_tokens >= len(PROMPT), what="recompute")
    b.check_pages(r, len(PROMPT))  # recomputed locally, not half-restored
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed
    c = counters(b)
    assert (c["sync_loads"], c["loads_finished"], c["loads_failed"]) == (1, 0, 1)
    assert_nothing_left(b, orbit_manager)
    a.shutdown()
    b.shutdown()


def test_a_stalled_manager_holds_an_in_step_load_at_most_the_scheduler_timeout(
    model_dir: Path, orbit_manager: ManagerProcess
) -> None:
    """The Manager stops answering (SIGSTOP) between the lookup and the step's acquire:
    the step goes on after `scheduler_timeout_ms`, the hit is recomputed, and the late
    acquire's lease is released once the Manager answers again."""
    a, b, r, so, spec = saved_then_admitted(
        model_dir, orbit_manager, "kvcopy", extra={"orbitkv.scheduler_timeout_ms": 200}
    )
    b.worker.worker_side.session.namespace(b"")  # connected and registered before the stall
    stop_all_threads(orbit_manager.proc.pid)
    try:
        t0 = time.monotonic()
        res = b.execute(so)
        took = time.monotonic() - t0
    finally:
        os.kill(orbit_manager.proc.pid, signal.SIGCONT)
    # Liveness, not speed: far below the workers' 5 s call timeout.
    assert took < 2.5, f"the step waited {took:.2f}s on a stalled Manager"
    assert res.kv_output.invalid_block_ids == set(spec.block_ids)
    assert r.num_computed_tokens == 0 and not r.output_token_ids
    b.run_until(lambda: r.num_computed_tokens >= len(PROMPT), what="recompute")
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed
    b.run_until(lambda: not b.worker.worker_side._in_step, what="the late acquire's release")
    assert_nothing_left(b, orbit_manager)
    a.shutdown()
    b.shutdown()


def test_a_hit_with_blocks_on_ssd_still_loads_asynchronously(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Staging from SSD would hold the step: such a hit takes the asynchronous path."""
    tmp = Path(tmp_path_factory.mktemp("mgr", numbered=True))
    ssd = tmp / "ssd"
    ssd.mkdir(mode=0o700)
    args = ("--ssd-dir", str(ssd), "--ssd-capacity", "512MiB", "--ssd-mode", "kernel", "--ssd-write-policy", "eager")
    with manager_in_short_dir(tmp / "m", "okvsync", extra_args=args, dram_size="16MiB") as m:
        a = build(model_dir, m, "native")
        save_prompt(a)
        # Written behind to SSD, then pushed out of DRAM by other blocks of the namespace.
        deadline = time.monotonic() + 30
        while m.stats()["ssd_spilled_blocks_total"] < FULL_BLOCKS:
            assert time.monotonic() < deadline, m.stats()
            time.sleep(0.05)
        s = a.connector.scheduler_side.session
        with m.client() as c:
            ns = c.register_namespace(s.fingerprint, s.block_bytes, shard=s.shard, salt=b"")
            for _ in range(10):  # 10,240 blocks of the same namespace through an 8,192-slot arena
                c.save(ns, [os.urandom(32) for _ in range(1024)], bytes(1024 * s.block_bytes))
        m.quiet_counter("ssd_spilled_blocks_total")
        b = build(model_dir, m, "native")
        r = make_request(PROMPT)
        b.scheduler.add_request(r)
        so = b.schedule_admitting(r)
        assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS, "an SSD hit must not load in step"
        assert not so.has_sync_kv_loads
        meta = so.kv_connector_metadata
        assert isinstance(meta, OrbitKVConnectorMetadata)
        assert [(spec.sync, len(spec.block_ids)) for spec in meta.loads] == [(False, FULL_BLOCKS)]
        b.execute(so)
        b.run_until(lambda: r.num_computed_tokens >= len(PROMPT) and r.status == RequestStatus.RUNNING)
        b.check_pages(r, len(PROMPT))
        b.run_to_completion([r.request_id])
        assert counters(b)["sync_loads"] == 0
        assert_nothing_left(b, m)
        a.shutdown()
        b.shutdown()
