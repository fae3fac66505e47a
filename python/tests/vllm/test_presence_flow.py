"""The scheduler's presence path with the released vLLM Scheduler and a real Manager.

A request whose first block the Manager's shared presence table says is absent misses
with no Manager message; a probable hit is looked up on a background thread while
`get_num_new_matched_tokens` returns None (vLLM skips the request and asks again next
step), then loads byte-exact; a Manager killed while that lookup is in flight costs a
miss, never the request.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import signal
import threading
import time
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens, stop_all_threads

from orbitkv.vllm.scheduler import OrbitKVScheduler

pytestmark = [pytest.mark.vllm, pytest.mark.native]

PROMPT = prompt_tokens(100, seed=11)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK


def build(model_dir: Path, manager: ManagerProcess, **extra: object) -> Engine:
    return Engine.build(make_vllm_config(model_dir, socket_path=str(manager.socket_path), extra=dict(extra)))


def counters(engine: Engine) -> dict[str, int]:
    return dict(engine.connector.scheduler_side.counters)


def save_prompt(model_dir: Path, manager: ManagerProcess, prompt: list[int]) -> None:
    a = build(model_dir, manager)
    r = make_request(prompt)
    a.scheduler.add_request(r)
    a.run_to_completion([r.request_id])
    a.run_until_drained()
    a.shutdown()


def test_a_miss_sends_the_manager_no_message(model_dir: Path, orbit_manager: ManagerProcess) -> None:
    e = build(model_dir, orbit_manager)
    e.connector.scheduler_side.session.client()  # connected (and the table mapped) first
    before = orbit_manager.stats()["lookups_total"]
    ids = []
    for i in range(4):
        r = make_request(prompt_tokens(80, seed=300 + i))
        e.scheduler.add_request(r)
        ids.append(r.request_id)
    so = e.scheduler.schedule()
    assert all(so.num_scheduled_tokens.get(i, 0) > 0 for i in ids), "every miss is admitted in the same step"
    c = counters(e)
    assert (c["presence_misses"], c["lookups"], c["async_lookups"]) == (4, 0, 0), c
    assert orbit_manager.stats()["lookups_total"] == before, "no lookup reached the Manager"
    e.execute(so)
    e.run_to_completion(ids)
    e.run_until_drained()
    e.assert_drained()
    e.shutdown()


def test_a_probable_hit_is_answered_a_step_later_byte_exact(
    model_dir: Path, orbit_manager: ManagerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_prompt(model_dir, orbit_manager, PROMPT)
    threads: list[int] = []
    real = OrbitKVScheduler._lookup_call

    def spy(self: OrbitKVScheduler, salt: bytes, hashes: list[bytes]):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())  # observes only: the real lookup runs
        return real(self, salt, hashes)

    monkeypatch.setattr(OrbitKVScheduler, "_lookup_call", spy)  # the inline (Python) lookup path
    before = orbit_manager.stats()["lookups_total"]
    b = build(model_dir, orbit_manager, **{"orbitkv.lookup_wait_us": 0})  # never waits: always a step later
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    first = b.step()
    assert r.request_id not in first.scheduler_output.num_scheduled_tokens, "skipped while the lookup runs"
    assert r.status == RequestStatus.WAITING
    assert counters(b)["async_lookups"] == 1
    so = b.schedule_admitting(r)
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert [len(spec.block_ids) for spec in so.kv_connector_metadata.loads] == [FULL_BLOCKS]
    # The lookup reached the Manager, from the client's native lookup thread: the
    # scheduler thread never made an inline lookup call.
    assert orbit_manager.stats()["lookups_total"] == before + 1
    assert threads == [], "no lookup ran on the scheduler thread"
    b.execute(so)

    def prefilled() -> bool:
        return r.status == RequestStatus.RUNNING and r.num_computed_tokens >= len(PROMPT)

    b.run_until(prefilled, what="prefill after the load")
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert (c["lookups"], c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (1, FULL_BLOCKS, 1, 0), c
    b.run_until_drained()
    b.assert_drained()
    orbit_manager.settled_stats(live_leases=0, live_saves=0)
    b.shutdown()


def test_the_inline_lookup_setting_answers_in_the_same_step(model_dir: Path, orbit_manager: ManagerProcess) -> None:
    save_prompt(model_dir, orbit_manager, PROMPT)
    b = build(model_dir, orbit_manager, **{"orbitkv.async_lookups": False})
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.scheduler.schedule()
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    b.execute(so)
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert (c["lookups"], c["async_lookups"], c["hit_blocks"], c["loads_finished"]) == (1, 0, FULL_BLOCKS, 1), c
    b.run_until_drained()
    b.assert_drained()
    b.shutdown()


def test_a_background_lookup_answered_within_the_step_wait_is_taken_the_same_step(
    model_dir: Path, orbit_manager: ManagerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """orbitkv.lookup_wait_us: the lookup still runs on the client's native thread (the
    scheduler thread makes no lookup call), but the step waits for its answer within the
    budget, so the hit is admitted and its load planned in the first step."""
    save_prompt(model_dir, orbit_manager, PROMPT)
    threads: list[int] = []
    real = OrbitKVScheduler._lookup_call

    def spy(self: OrbitKVScheduler, salt: bytes, hashes: list[bytes]):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())
        return real(self, salt, hashes)

    monkeypatch.setattr(OrbitKVScheduler, "_lookup_call", spy)
    # A budget no loaded CI machine exceeds; the default (1 ms) is sized for a GPU host.
    b = build(model_dir, orbit_manager, **{"orbitkv.lookup_wait_us": 100_000})
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.scheduler.schedule()
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS, "admitted for its load in the first step"
    assert [len(spec.block_ids) for spec in so.kv_connector_metadata.loads] == [FULL_BLOCKS]
    assert threads == [], "no lookup ran on the scheduler thread"
    b.execute(so)
    b.run_until(lambda: r.status == RequestStatus.RUNNING and r.num_computed_tokens >= len(PROMPT), what="prefill")
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert (c["lookups"], c["async_lookups"], c["lookups_answered_in_step"]) == (1, 1, 1), c
    assert (c["hit_blocks"], c["loads_finished"]) == (FULL_BLOCKS, 1), c
    b.run_until_drained()
    b.assert_drained()
    b.shutdown()


def test_manager_killed_while_a_lookup_is_pending_is_a_miss(model_dir: Path, orbit_manager: ManagerProcess) -> None:
    save_prompt(model_dir, orbit_manager, PROMPT)
    b = build(model_dir, orbit_manager)
    b.connector.scheduler_side.session.namespace(b"")  # connected and registered first
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    stop_all_threads(orbit_manager.proc.pid)
    try:
        first = b.step()  # the table says "maybe": the lookup is sent, the Manager is silent
        assert r.request_id not in first.scheduler_output.num_scheduled_tokens
        assert counters(b)["async_lookups"] == 1
        assert b.connector.scheduler_side._reqs[r.request_id].pending is not None, "the lookup is in flight"
    finally:
        orbit_manager.proc.send_signal(signal.SIGKILL)
        orbit_manager.proc.wait(timeout=10)
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed, "a lost lookup costs a miss, never the request"
    c = counters(b)
    assert (c["hit_blocks"], c["loads_started"], c["lookups"]) == (0, 0, 0), c
    assert c["manager_errors"] >= 1, c
    b.run_until_drained()
    b.assert_drained()
    b.shutdown()


def test_a_request_finished_while_its_lookup_runs_releases_the_lease(
    model_dir: Path, orbit_manager: ManagerProcess
) -> None:
    save_prompt(model_dir, orbit_manager, PROMPT)
    b = build(model_dir, orbit_manager, **{"orbitkv.lookup_wait_us": 0})  # the lookup outlives the step
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    b.step()  # lookup submitted
    b.scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_ABORTED)
    side = b.connector.scheduler_side
    deadline = time.monotonic() + 10
    while orbit_manager.stats()["live_leases"] or side._orphans:
        side._reap_orphans()  # what the next scheduler call does
        assert time.monotonic() < deadline, "the orphaned lookup's lease was never released"
        time.sleep(0.01)
    assert counters(b)["stale_lookups"] == 1
    b.run_until_drained()
    b.assert_drained()
    b.shutdown()
