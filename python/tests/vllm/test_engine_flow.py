"""Released vLLM 0.31.0 Scheduler + OrbitKV + a real Manager process (issue 3 acceptance).

Every scenario drives `schedule()` / `update_from_output()` of the real Scheduler, runs
the worker-role connector over real CPU KV pages, and checks (a) the scheduler's
decisions, (b) byte-exact page contents where KV was restored, and (c) that no
request, block or OrbitKV owner (lease, load, save) is left behind.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from vllm.lora.request import LoRARequest
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import (
    BLOCK,
    Engine,
    make_request,
    make_vllm_config,
    prompt_tokens,
    stop_all_threads,
    write_peft_adapter,
)

from orbitkv.engine.session import is_not_connected
from orbitkv.vllm.metadata import OrbitKVConnectorMetadata
from orbitkv.vllm.native import ManagerSession

if TYPE_CHECKING:
    from orbitkv._native import Client

pytestmark = [pytest.mark.vllm, pytest.mark.native]


@pytest.fixture
def manager(orbit_manager: ManagerProcess) -> ManagerProcess:
    """A real Manager with fault injection enabled (this suite's own fixture)."""
    return orbit_manager


PROMPT = prompt_tokens(100, seed=1)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK


def build(model_dir: Path, manager: ManagerProcess, **kw) -> Engine:  # type: ignore[no-untyped-def]
    return Engine.build(make_vllm_config(model_dir, socket_path=str(manager.socket_path), **kw))


def counters(engine: Engine) -> dict[str, int]:
    return dict(engine.connector.scheduler_side.counters)


def queries(c: dict[str, int]) -> int:
    """Requests answered by a Manager lookup or, for a certain miss, by the presence table."""
    return c["lookups"] + c["presence_misses"]


def prefill_done(engine: Engine, req_id: str, n: int):  # type: ignore[no-untyped-def]
    def pred() -> bool:
        r = engine.scheduler.requests.get(req_id)
        return r is not None and r.status == RequestStatus.RUNNING and r.num_computed_tokens >= n

    return pred


def run_and_save(engine: Engine, prompt: list[int], **kw) -> str:  # type: ignore[no-untyped-def]
    r = make_request(prompt, **kw)
    engine.scheduler.add_request(r)
    engine.run_to_completion([r.request_id])
    return r.request_id


def assert_full_hit(engine: Engine, r, what: str) -> None:  # type: ignore[no-untyped-def]
    """Run `r` on `engine`: the whole prompt prefix loads from OrbitKV, byte-exact."""
    engine.scheduler.add_request(r)
    engine.run_until(prefill_done(engine, r.request_id, len(PROMPT)), what=what)
    engine.check_pages(r, len(PROMPT))
    engine.run_to_completion([r.request_id])
    assert counters(engine)["hit_blocks"] == FULL_BLOCKS


def assert_no_leases_held(engine: Engine, manager: ManagerProcess) -> None:
    c = counters(engine)
    # Every lease a lookup returned was released (hit leases and zero-hit leases), or
    # went with a dropped connection's session ...
    assert c["leases_released"] + c["leases_lost_with_session"] == c["lookups"], c
    # ... and the Manager agrees: no lease or pending save is left (L1, L2, L4).
    manager.settled_stats(live_leases=0, live_saves=0)


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_cold_miss_save_then_full_hit_byte_exact(model_dir: Path, manager: ManagerProcess, layout: str) -> None:
    a = build(model_dir, manager, layout=layout)
    rid = run_and_save(a, PROMPT)
    c = counters(a)
    # A cold miss: the presence table answers, the Manager gets no lookup.
    assert (c["lookups"], c["presence_misses"], c["hit_blocks"], c["loads_started"]) == (0, 1, 0, 0)
    assert c["save_blocks_planned"] >= FULL_BLOCKS and c["saved_blocks"] >= FULL_BLOCKS
    assert c["failed_saves"] == 0 and rid in a.finished
    a.assert_drained()
    assert_no_leases_held(a, manager)

    # A second engine sharing the Manager (no HBM state): the whole prompt prefix hits.
    b = build(model_dir, manager, layout=layout)
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.schedule_admitting(r)  # the probable hit's lookup lands a step or more later
    assert b.status(r.request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata)
    assert [len(spec.block_ids) for spec in meta.loads] == [FULL_BLOCKS]
    b.execute(so)
    b.run_until(prefill_done(b, r.request_id, len(PROMPT)), what="prefill after load")
    b.check_pages(r, len(PROMPT))  # 96 restored tokens + 4 computed, byte for byte
    w = b.worker.worker_side.counters
    assert w["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert (c["lookups"], c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (1, FULL_BLOCKS, 1, 0)
    b.assert_drained()
    assert_no_leases_held(b, manager)
    # The scheduler only looks up: its session never mapped the arena; the worker's did.
    assert b.connector.scheduler_side.session.client().control_only
    assert not b.worker.worker_side.session.client().control_only
    a.shutdown()
    b.shutdown()


def test_partial_hit_loads_the_common_prefix(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    run_and_save(a, PROMPT)
    b = build(model_dir, manager)
    mixed = PROMPT[: 4 * BLOCK] + prompt_tokens(36, seed=99)
    r = make_request(mixed)
    b.scheduler.add_request(r)
    so = b.schedule_admitting(r)
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata) and [len(s.block_ids) for s in meta.loads] == [4]
    b.execute(so)
    b.run_until(prefill_done(b, r.request_id, len(mixed)), what="partial-hit prefill")
    b.check_pages(r, len(mixed))
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert (c["lookups"], c["lookup_blocks"], c["hit_blocks"]) == (1, (len(mixed) - 1) // BLOCK, 4)
    b.assert_drained()
    assert_no_leases_held(b, manager)


def test_native_hbm_hit_issues_no_manager_query(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    run_and_save(a, PROMPT)
    before = counters(a)
    manager_lookups = manager.stats()["lookups_total"]
    r = make_request(PROMPT)
    a.scheduler.add_request(r)
    a.step()
    # vLLM's own prefix cache covers every reusable block: no lookup at all (O5).
    assert a.status(r.request_id) == RequestStatus.RUNNING
    assert queries(counters(a)) == queries(before)
    assert manager.stats()["lookups_total"] == manager_lookups  # the Manager saw no query
    a.run_to_completion([r.request_id])
    # A longer prompt queries only the blocks past the native hit: the first of them was
    # never saved, so the presence table answers a miss (a query from block 0, which
    # was saved, would have been a probable hit sent to the Manager).
    longer = PROMPT + prompt_tokens(40, seed=5)
    r2 = make_request(longer)
    a.scheduler.add_request(r2)
    a.step()
    after = counters(a)
    assert after["presence_misses"] == before["presence_misses"] + 1
    assert (after["lookups"], after["async_lookups"]) == (before["lookups"], before["async_lookups"])
    assert manager.stats()["lookups_total"] == manager_lookups
    a.run_to_completion([r2.request_id])
    a.assert_drained()
    assert_no_leases_held(a, manager)


def test_preempted_request_resumes_from_orbitkv(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    r = make_request(PROMPT, max_tokens=24)
    a.scheduler.add_request(r)
    a.run_until(lambda: len(r.output_token_ids) >= 8, what="decode progress")
    # The release's own preemption path: every running request is preempted and the
    # HBM prefix cache is dropped, so the resumed request can only reuse OrbitKV.
    assert a.scheduler.reset_prefix_cache(reset_running_requests=True)
    assert r.status == RequestStatus.PREEMPTED and r.num_preemptions == 1
    res = a.step()
    assert r.request_id in (res.scheduler_output.preempted_req_ids or set())
    so = res.scheduler_output
    if r.status == RequestStatus.PREEMPTED:  # its lookup is in flight (a probable hit)
        so = a.schedule_admitting(r)
        a.execute(so)
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata)
    loaded = sum(len(s.block_ids) for s in meta.loads)
    assert loaded >= FULL_BLOCKS, "the resumed request should load the blocks saved before preemption"
    n = r.num_tokens - 1
    a.run_until(prefill_done(a, r.request_id, n), what="resume after preemption")
    a.check_pages(r, n)
    a.run_to_completion([r.request_id])
    a.assert_drained()
    assert_no_leases_held(a, manager)


def test_abort_during_async_load_frees_everything(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    run_and_save(a, PROMPT)
    b = build(model_dir, manager)
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.schedule_admitting(r)
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    # The abort arrives while the step that carries the load is in flight.
    b.scheduler.finish_requests(r.request_id, RequestStatus.FINISHED_ABORTED)
    assert r.request_id in b.scheduler.requests, "destination blocks must stay held until the load drains"
    assert b.connector.scheduler_side.tracked_requests == 1
    b.execute(so)
    b.run_until(lambda: not b.scheduler.requests, what="drain of the aborted load")
    b.assert_drained()
    assert_no_leases_held(b, manager)
    assert counters(b)["loads_finished"] + counters(b)["loads_failed"] == 1


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_injected_restore_failure_is_recomputed_under_either_policy(
    model_dir: Path, manager: ManagerProcess, policy: str
) -> None:
    a = build(model_dir, manager)
    run_and_save(a, PROMPT)
    b = build(model_dir, manager, failure_policy=policy)
    with manager.client() as c:
        c.inject_faults(restore_failures=1)
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    reported = []

    def failure_handled() -> bool:
        return r.request_id in b.finished or r.status == RequestStatus.RUNNING

    for res in b.run_until(failure_handled, what="load failure handling"):
        if res.kv_output.failed_recving:
            reported.append(res.kv_output)
    assert len(reported) == 1, "the failed receive must be reported exactly once"
    out = reported[0]
    # V2: a failed receive is also a finished receive, in the same poll.
    assert out.failed_recving == {r.request_id} <= (out.finished_recving or set())
    assert len(out.invalid_block_ids) == FULL_BLOCKS
    # L7: OrbitKV set vLLM's default "fail" to "recompute" at start-up (failures.py), so
    # under either policy the request is recomputed and finishes normally.
    assert b.scheduler.recompute_kv_load_failures
    b.run_until(prefill_done(b, r.request_id, len(PROMPT)), what="recompute")
    b.check_pages(r, len(PROMPT))  # recomputed locally, not half-restored
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed
    assert counters(b)["loads_failed"] == 1
    b.assert_drained()
    assert_no_leases_held(b, manager)


def test_failed_save_loses_the_entry_never_the_request(model_dir: Path, manager: ManagerProcess) -> None:
    # L4: every commit fails (injected in the Manager): the request still finishes
    # normally, nothing partial becomes visible, and a second engine misses cold.
    with manager.client() as c:
        c.inject_faults(commit_failures=1000)
    a = build(model_dir, manager)
    rid = run_and_save(a, PROMPT)
    assert rid in a.finished and rid not in a.failed
    c1 = counters(a)
    assert c1["failed_saves"] >= 1 and c1["saved_blocks"] == 0, c1
    stats = manager.stats()
    assert stats["commit_failures_injected_total"] >= 1 and stats["blocks_committed_total"] == 0
    assert stats["dram_pending_save_bytes"] == 0, "aborted saves free their slots"
    with manager.client() as c:
        c.inject_faults(commit_failures=0)
    b = build(model_dir, manager)
    run_and_save(b, PROMPT)
    c2 = counters(b)
    assert (queries(c2), c2["hit_blocks"]) == (1, 0), "nothing of the failed saves is visible"
    assert c2["presence_misses"] == 1, "not even in the presence table"
    a.assert_drained()
    b.assert_drained()
    assert_no_leases_held(b, manager)
    a.shutdown()
    b.shutdown()


def test_external_reset_refused_while_tracked_then_fresh_generation(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    run_and_save(a, PROMPT)
    live = make_request(prompt_tokens(40, seed=3), max_tokens=50)
    a.scheduler.add_request(live)
    a.step()
    side = a.connector.scheduler_side
    assert side.reset_cache() is False  # a tracked request: refused (L5)
    assert a.scheduler.reset_prefix_cache(reset_connector=True) is False
    assert side.counters["resets"] == 0 and manager.stats()["generation_bumps_total"] == 0
    a.scheduler.finish_requests(live.request_id, RequestStatus.FINISHED_ABORTED)
    a.run_until(lambda: not a.scheduler.requests, what="abort")

    # Another engine on the same fingerprint holds a lease (its load is pending):
    # the Manager refuses the generation reset with Busy, and so does the adapter.
    run_and_save(a, PROMPT, cache_salt="tenant")
    other = build(model_dir, manager)
    pending = make_request(PROMPT)
    other.scheduler.add_request(pending)
    pending_step = other.schedule_admitting(pending)  # looked up and pinned; load not run yet
    assert pending.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert a.scheduler.reset_prefix_cache(reset_connector=True) is False
    assert side.counters["resets"] == 0
    other.scheduler.finish_requests(pending.request_id, RequestStatus.FINISHED_ABORTED)
    other.execute(pending_step)
    other.run_until(lambda: not other.scheduler.requests, what="other engine drain")

    bumps = manager.stats()["generation_bumps_total"]
    assert a.scheduler.reset_prefix_cache(reset_connector=True) is True
    assert side.counters["resets"] == 1
    assert manager.stats()["generation_bumps_total"] > bumps
    misses, hits = side.counters["presence_misses"], side.counters["hit_blocks"]
    run_and_save(a, PROMPT)  # cold miss in the new generation, then saved again
    run_and_save(a, PROMPT, cache_salt="tenant")  # every salt of the fingerprint moved
    # The old generation left the presence table with the reset: two certain misses.
    assert side.counters["presence_misses"] == misses + 2 and side.counters["hit_blocks"] == hits

    # HBM-only reset keeps the generation: the newly saved blocks are reused.
    assert a.scheduler.reset_prefix_cache() is True
    r = make_request(PROMPT)
    a.scheduler.add_request(r)
    a.execute(a.schedule_admitting(r))
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    a.run_until(prefill_done(a, r.request_id, len(PROMPT)), what="reuse after HBM reset")
    a.check_pages(r, len(PROMPT))
    a.run_to_completion([r.request_id])
    assert side.counters["hit_blocks"] == hits + FULL_BLOCKS
    a.assert_drained()
    assert_no_leases_held(a, manager)


def test_lora_adapter_swap_changes_the_namespace(model_dir: Path, manager: ManagerProcess, tmp_path: Path) -> None:
    adapter = write_peft_adapter(tmp_path / "sql-lora", b"weights-v1")
    other = write_peft_adapter(tmp_path / "undeclared", b"weights-x")
    extra = {"orbitkv.static_lora_adapters": {"sql": str(adapter)}}
    lora = LoRARequest("sql", 1, str(adapter))

    a = build(model_dir, manager, lora=True, extra=extra)
    run_and_save(a, PROMPT, lora_request=lora)
    assert counters(a)["saved_blocks"] >= FULL_BLOCKS
    # An undeclared adapter bypasses OrbitKV entirely: no lookup, no save.
    before = counters(a)
    run_and_save(a, prompt_tokens(60, seed=8), lora_request=LoRARequest("other", 2, str(other)))
    after = counters(a)
    assert after["bypassed_requests"] == before["bypassed_requests"] + 1
    assert queries(after) == queries(before) and after["save_blocks_planned"] == before["save_blocks_planned"]

    # Same name and path, new weights: vLLM's block hashes are unchanged, the
    # namespace is not, so nothing is shared.
    write_peft_adapter(adapter, b"weights-v2")
    b = build(model_dir, manager, lora=True, extra=extra)
    assert b.connector.fingerprint != a.connector.fingerprint
    run_and_save(b, PROMPT, lora_request=lora)
    assert counters(b)["hit_blocks"] == 0 and queries(counters(b)) == 1

    # Restoring the original weights restores the original namespace.
    write_peft_adapter(adapter, b"weights-v1")
    c = build(model_dir, manager, lora=True, extra=extra)
    assert c.connector.fingerprint == a.connector.fingerprint
    assert_full_hit(c, make_request(PROMPT, lora_request=lora), "LoRA hit")
    for e in (a, b, c):
        e.assert_drained()
        assert_no_leases_held(e, manager)


def test_two_salts_never_share(model_dir: Path, manager: ManagerProcess) -> None:
    a = build(model_dir, manager)
    run_and_save(a, PROMPT, cache_salt="tenant-a")
    b = build(model_dir, manager)
    run_and_save(b, PROMPT, cache_salt="tenant-b")
    run_and_save(b, PROMPT)  # no salt: also a different namespace
    # Other namespaces get other presence keys: certain misses, no Manager lookup.
    assert counters(b)["hit_blocks"] == 0 and counters(b)["presence_misses"] == 2
    c = build(model_dir, manager)
    assert_full_hit(c, make_request(PROMPT, cache_salt="tenant-a"), "same-salt hit")
    for e in (a, b, c):
        e.assert_drained()
        assert_no_leases_held(e, manager)


def reconnected(session: ManagerSession) -> Client:
    """The session's client once its background reconnection finished."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return session.client()
        except Exception as exc:
            if not is_not_connected(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_dropped_scheduler_connection_loses_its_leases_not_the_next_connection(
    model_dir: Path, manager: ManagerProcess
) -> None:
    """The scheduler's session drops while it pins a load's sources: the Manager
    releases them with the session; the adapter neither fails the release nor
    disturbs its new connection; the load (the worker's own session) completes."""
    a = build(model_dir, manager)
    run_and_save(a, PROMPT)
    b = build(model_dir, manager)
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    held = manager.stats()["live_leases"]  # (other engines' leases, if any)
    so = b.schedule_admitting(r)  # the lookup pins the hit; the load is planned, not run
    assert b.status(r.request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS
    side = b.connector.scheduler_side
    old = side.session.client()
    assert manager.stats()["live_leases"] == held + 1
    side.session.drop_client()  # the connection is gone before the load even starts
    assert manager.stats()["live_leases"] == held, "the Manager released the lease with the session"
    new = reconnected(side.session)  # the next connection is made in the background
    assert new.session_id != old.session_id
    b.execute(so)  # the worker loads through its own session
    b.run_until(prefill_done(b, r.request_id, len(PROMPT)), what="prefill after load")
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert (c["leases_lost_with_session"], c["manager_errors"], c["loads_failed"]) == (1, 0, 0), repr(c)
    assert side.session.client() is new, "the new connection was kept"
    b.assert_drained()
    assert_no_leases_held(b, manager)
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("async_lookups", [True, False])
def test_stalled_manager_holds_the_scheduler_step_at_most_the_scheduler_timeout(
    model_dir: Path, manager: ManagerProcess, async_lookups: bool
) -> None:
    """A Manager that stops answering (SIGSTOP: alive, connected, silent) during a
    probable hit's lookup: inline, it costs the scheduler one bounded wait; in the
    background, none. Either way the lookup times out into a miss and the request
    runs and finishes. (A certain miss never asks the Manager at all.)"""
    run_and_save(build(model_dir, manager), PROMPT)
    extra = {"orbitkv.scheduler_timeout_ms": 200, "orbitkv.async_lookups": async_lookups}
    e = build(model_dir, manager, extra=extra)
    e.connector.scheduler_side.session.namespace(b"")  # connected and registered before the stall
    miss = make_request(prompt_tokens(80, seed=77))
    r = make_request(PROMPT)
    e.scheduler.add_request(miss)
    e.scheduler.add_request(r)
    side = e.connector.scheduler_side
    # kill() only queues the stop: wait until every Manager thread is stopped, or a
    # running session thread may still answer the lookup.
    stop_all_threads(manager.proc.pid)
    try:
        t0 = time.monotonic()
        so = e.scheduler.schedule()
        waited = time.monotonic() - t0
        if async_lookups:
            pending = side._reqs[r.request_id].pending
            assert pending is not None
            deadline = time.monotonic() + 10
            while not pending.done():  # the background lookup times out on its own
                assert time.monotonic() < deadline, "the background lookup never timed out"
                time.sleep(0.01)
    finally:
        os.kill(manager.proc.pid, signal.SIGCONT)
    # Liveness, not speed: far below the 5 s call timeout the workers keep.
    assert waited < 2.5, f"the scheduler step waited {waited:.2f}s on a stalled Manager"
    assert so.num_scheduled_tokens.get(miss.request_id, 0) > 0, "the certain miss is admitted at once"
    if not async_lookups:
        assert so.num_scheduled_tokens.get(r.request_id, 0) > 0, "scheduled as a miss"
    else:
        assert r.request_id not in so.num_scheduled_tokens, "asked again next step"
    e.execute(so)
    e.run_to_completion([r.request_id, miss.request_id])
    assert {r.request_id, miss.request_id} <= e.finished
    c = counters(e)
    assert c["manager_errors"] == 1 and c["lookups"] == 0 and c["hit_blocks"] == 0, c
    assert c["presence_misses"] == 1 and c["async_lookups"] == int(async_lookups), c
    e.assert_drained()
    e.shutdown()


def test_unreachable_manager_costs_a_miss_never_a_request(model_dir: Path, tmp_path: Path) -> None:
    """L4: with no Manager, lookups are misses and saves are dropped; requests finish."""
    e = Engine.build(make_vllm_config(model_dir, socket_path=str(tmp_path / "absent.sock")))
    ids = [run_and_save(e, prompt_tokens(80, seed=40 + i)) for i in range(3)]
    assert set(ids) <= e.finished and not (set(ids) & e.failed)
    c = counters(e)
    assert c["lookups"] == 0 and c["manager_errors"] >= 1
    assert c["failed_saves"] >= 1 and c["saved_blocks"] == 0
    e.assert_drained()


def test_chunked_prefill_and_decode_blocks_are_saved_once(model_dir: Path, manager: ManagerProcess) -> None:
    """Saves follow block completion across unaligned prefill chunks and decode steps."""
    a = build(model_dir, manager, max_num_batched_tokens=40)  # 2.5 blocks per chunk
    r = make_request(PROMPT, max_tokens=44)  # 100 prompt + 44 output tokens = 9 blocks
    a.scheduler.add_request(r)
    planned: list[bytes] = []
    while r.request_id not in a.finished:
        meta = a.step().scheduler_output.kv_connector_metadata
        assert isinstance(meta, OrbitKVConnectorMetadata)
        planned += [h for spec in meta.saves for h in spec.hashes]
    full_tokens = PROMPT + list(r.output_token_ids)
    # Each block whose KV was computed is saved exactly once; the last sampled token is
    # never fed back, so its block is not complete in the cache.
    assert len(planned) == len(set(planned)) == (len(full_tokens) - 1) // BLOCK
    assert planned == list(r.block_hashes[: len(planned)])

    # Another engine continuing the conversation reuses prompt *and* decode blocks.
    b = build(model_dir, manager)
    follow_prompt = full_tokens + prompt_tokens(20, seed=77)
    follow = make_request(follow_prompt)
    b.scheduler.add_request(follow)
    b.run_until(prefill_done(b, follow.request_id, len(follow_prompt)), what="follow-up prefill")
    b.check_pages(follow, len(follow_prompt))
    assert counters(b)["hit_blocks"] == len(planned)
    b.run_to_completion([follow.request_id])
    for e in (a, b):
        e.assert_drained()
        assert_no_leases_held(e, manager)
