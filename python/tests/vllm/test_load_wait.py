"""`orbitkv.load_wait_us` through the released Scheduler and a real Manager.

A hit is loaded asynchronously (vLLM parks the request in `WAITING_FOR_REMOTE_KVS`); with
the wait, the worker lets the step's loads complete before it reports its results, so
the load started in the admitting step is reported in that step's output and the request
prefills in the very next step. Checked on both worker copy paths (the native client, and
`orbitkv.kvcopy` on CPU pages): byte-exact pages, the step's wait bounded when the Manager
stops answering, and no request, block, lease or save left behind.
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
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens, stop_all_threads

from orbitkv.vllm.metadata import OrbitKVConnectorMetadata

pytestmark = [pytest.mark.vllm, pytest.mark.native]

PROMPT = prompt_tokens(100, seed=5)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK
COPY_PATHS = {"native": {}, "kvcopy": {"orbitkv.copy_engine": "torch"}}


def build(model_dir: Path, manager: ManagerProcess, copy: str, **extra) -> Engine:  # type: ignore[no-untyped-def]
    cfg = make_vllm_config(model_dir, socket_path=str(manager.socket_path), extra={**COPY_PATHS[copy], **extra})
    return Engine.build(cfg)


def counters(engine: Engine) -> dict[str, int]:
    return dict(engine.connector.scheduler_side.counters)


def assert_nothing_left(engine: Engine, manager: ManagerProcess) -> None:
    engine.run_until_drained()  # finished requests whose saves still copy (kvcopy) included
    engine.assert_drained()
    c = counters(engine)
    assert c["leases_released"] + c["leases_lost_with_session"] == c["lookups"], c
    manager.settled_stats(live_leases=0, live_saves=0)


def saved_then_admitted(model_dir: Path, manager: ManagerProcess, copy: str, **extra):  # type: ignore[no-untyped-def]
    """Engine `a` computes and saves PROMPT; a fresh engine `b` with `extra` settings is
    given it and schedules until it is parked for its load (returned unexecuted)."""
    a = build(model_dir, manager, copy)
    r0 = make_request(PROMPT)
    a.scheduler.add_request(r0)
    a.run_to_completion([r0.request_id])
    a.run_until_drained()
    b = build(model_dir, manager, copy, **extra)
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.schedule_admitting(r)
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata)
    assert [len(spec.block_ids) for spec in meta.loads] == [FULL_BLOCKS]
    return a, b, r, so


@pytest.mark.parametrize("copy", list(COPY_PATHS))
def test_a_load_is_reported_in_the_step_that_starts_it(
    model_dir: Path, orbit_manager: ManagerProcess, copy: str
) -> None:
    a, b, r, so = saved_then_admitted(model_dir, orbit_manager, copy, **{"orbitkv.load_wait_us": 500_000})
    res = b.execute(so)
    assert res.kv_output.finished_recving == {r.request_id} and not res.kv_output.failed_recving
    # The next step prefills the 4 remaining tokens on the 96 restored ones: first token.
    b.step()
    assert r.num_computed_tokens == len(PROMPT) and len(r.output_token_ids) == 1
    b.check_pages(r, len(PROMPT))
    c = counters(b)
    assert (c["lookups"], c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (1, FULL_BLOCKS, 1, 0)
    assert b.worker.worker_side.counters["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed
    assert_nothing_left(b, orbit_manager)
    a.shutdown()
    b.shutdown()


def test_a_stalled_manager_holds_the_step_at_most_the_load_wait(model_dir: Path, orbit_manager: ManagerProcess) -> None:
    """The Manager stops answering (SIGSTOP) between the lookup and the worker's acquire:
    the step returns after `load_wait_us` without the load; once the Manager answers
    again the load completes (or fails into a recompute) and the request finishes with
    exact pages."""
    a, b, r, so = saved_then_admitted(model_dir, orbit_manager, "kvcopy", **{"orbitkv.load_wait_us": 200_000})
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
    assert not res.kv_output.finished_recving
    b.run_until(lambda: r.num_computed_tokens >= len(PROMPT) and r.status == RequestStatus.RUNNING)
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed
    assert_nothing_left(b, orbit_manager)
    a.shutdown()
    b.shutdown()
