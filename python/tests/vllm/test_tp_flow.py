"""Tensor parallelism on one host (contracts T1-T3, K1, L2, L4) with the released vLLM
0.31.0 Scheduler on CPU: one worker-role connector per TP rank in its own process, each
with its own KV pages, and a real Manager with `--enable-query-control` (tp_harness.py).

Per request the scheduler makes one TP lookup over every rank's shard; each rank
restores its own shard from that lease by token, with no lookup of its own; a block one
rank lacks is a miss for all; a rank killed mid-load leaks no lease and serves no byte.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orbitkv_testing
import pytest
from tp_harness import TPEngine
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, make_request, prompt_tokens

from orbitkv.vllm.metadata import OrbitKVConnectorMetadata

pytestmark = [pytest.mark.vllm, pytest.mark.native]

PROMPT = prompt_tokens(100, seed=7)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK


@pytest.fixture
def qc_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """A real Manager with query control (and fault injection) enabled."""
    d = Path(tmp_path_factory.mktemp("tpmgr", numbered=True))
    short = Path("/tmp") / f"okv-tp-{os.getpid()}-{d.name}"
    short.mkdir(mode=0o700, exist_ok=True)
    mgr = ManagerProcess(
        short / "m.sock", d / "manager.log", fault_injection=True, extra_args=("--enable-query-control",)
    )
    try:
        yield mgr
    finally:
        mgr.stop()
        shutil.rmtree(short, ignore_errors=True)


def eventually(what: str, pred: Any, timeout: float = 20.0) -> None:
    orbitkv_testing.eventually(pred, what, timeout, poll=0.05)


def counters(e: TPEngine) -> dict[str, int]:
    return dict(e.connector.scheduler_side.counters)


def prefill_done(e: TPEngine, req_id: str, n: int) -> Any:
    def pred() -> bool:
        r = e.scheduler.requests.get(req_id)
        return r is not None and r.status == RequestStatus.RUNNING and r.num_computed_tokens >= n

    return pred


def run(e: TPEngine, prompt: list[int], params: dict[str, Any] | None = None, **kw: Any) -> Any:
    """Run `prompt` (with `kv_transfer_params` `params`) to completion; every rank's
    pages hold its shard's bytes at the end of the prefill (restored or computed)."""
    r = make_request(prompt, kv_transfer_params=params)
    e.scheduler.add_request(r)
    e.run_until(prefill_done(e, r.request_id, len(prompt)), what="prefill", **kw)
    e.check_pages(r, len(prompt))
    e.run_to_completion([r.request_id], **kw)
    assert r.request_id not in e.failed
    # Asynchronous saves hold the blocks until every rank reported finished_sending.
    e.run_until(lambda: r.request_id not in e.scheduler.requests, what="release of the blocks", **kw)
    return r


def assert_nothing_held(e: TPEngine, m: ManagerProcess) -> None:
    assert e.connector.scheduler_side.tracked_requests == 0
    st = m.stats()
    held = {k: st[k] for k in ("live_leases", "live_tp_leases", "live_saves", "dram_pinned_blocks")}
    assert held == dict.fromkeys(held, 0), held


def cold_miss_then_full_hit(e: TPEngine, m: ManagerProcess) -> None:
    block_bytes = e.connector.block_bytes
    run(e, PROMPT)
    c = counters(e)
    # A cold miss: shard 0's presence table entry is absent, so no TP lookup is sent.
    assert (c["lookups"], c["presence_misses"], c["hit_blocks"], c["loads_started"]) == (0, 1, 0, 0)
    assert c["failed_saves"] == 0
    assert m.stats()["dram_visible_blocks"] == e.tp * FULL_BLOCKS, "each rank saved its own shard"
    assert_nothing_held(e, m)

    e.reset_hbm()
    before = m.stats()
    r = make_request(PROMPT)
    e.scheduler.add_request(r)
    so = e.step_admitting(r)
    assert e.scheduler.requests[r.request_id].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata)
    (spec,) = meta.loads
    assert len(spec.block_ids) == FULL_BLOCKS and spec.token is not None and len(spec.token) == 16
    e.run_until(prefill_done(e, r.request_id, len(PROMPT)), what="prefill after the TP load")
    e.check_pages(r, len(PROMPT))  # 96 restored + 4 computed tokens, byte for byte, every rank
    e.run_to_completion([r.request_id])
    e.run_until(lambda: r.request_id not in e.scheduler.requests, what="release of the blocks")
    after = m.stats()
    delta = {k: after[k] - before[k] for k in ("tp_lookups_total", "lookups_total", "tp_parts_redeemed_total")}
    # One Manager call for all ranks; each rank redeemed its part, none looked up again.
    assert delta == {"tp_lookups_total": 1, "lookups_total": 0, "tp_parts_redeemed_total": e.tp}, delta
    # The ranks' releases are quiet and may still be queued in their clients.
    m.settled_stats(tp_leases_completed_total=before["tp_leases_completed_total"] + 1)
    for w in e.call("counters"):
        assert w["bytes_restored"] == FULL_BLOCKS * block_bytes and w["load_failures"] == 0, w
    c = counters(e)
    assert (c["lookups"], c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (1, FULL_BLOCKS, 1, 0)
    # The scheduler's release after every rank reported finds the lease ended: no error.
    assert (c["leases_released"], c["manager_errors"]) == (1, 0), c
    assert_nothing_held(e, m)


def rank_missing_blocks_shrinks_the_hit(e: TPEngine, m: ManagerProcess) -> None:
    """Rank 0's save of blocks 4..5 fails (an injected commit failure, ranks stepped in
    order): those blocks are a miss for every rank; the hit is the common 4 blocks."""
    p = prompt_tokens(100, seed=8)
    run(e, p[:70])  # blocks 0..3 on every rank
    e.reset_hbm()
    with m.client() as c:
        c.inject_faults(commit_failures=1)
    base = counters(e)["hit_blocks"]
    run(e, p, sequential=True)  # hit 4, computes and saves 4..5: rank 0's commit fails
    c = counters(e)
    assert c["hit_blocks"] - base == 4 and c["failed_saves"] == 1, c
    assert m.stats()["commit_failures_injected_total"] == 1
    e.reset_hbm()
    r = run(e, p)  # the common prefix: 4 blocks, although ranks 1.. hold 6
    c2 = counters(e)
    assert c2["hit_blocks"] - c["hit_blocks"] == 4, c2
    assert c2["loads_failed"] == 0 and r.request_id in e.finished
    assert_nothing_held(e, m)


def rank_save_failure_makes_a_miss_for_all(e: TPEngine, m: ManagerProcess) -> None:
    """Rank 0's only save of a prompt fails: the next request misses on every rank
    (no partial restore), recomputes, and the save after it repairs the shard."""
    p = prompt_tokens(100, seed=9)
    with m.client() as c:
        c.inject_faults(commit_failures=1)
    run(e, p, sequential=True)
    e.reset_hbm()
    c0 = counters(e)
    run(e, p)
    c1 = counters(e)
    assert c1["hit_blocks"] == c0["hit_blocks"] and c1["loads_started"] == c0["loads_started"], c1
    e.reset_hbm()
    run(e, p)  # every shard is complete again
    assert counters(e)["hit_blocks"] - c1["hit_blocks"] == FULL_BLOCKS
    assert_nothing_held(e, m)


def a_hint_reaches_every_shard(e: TPEngine, m: ManagerProcess) -> None:
    """With query control the scheduler sends a request's retention hint to every rank's
    shard namespace: each rank's blocks of the request are kept (most commit after the
    request finished: the hint waits for them)."""
    before = m.stats()["hint_kept_blocks"]
    run(e, prompt_tokens(100, seed=9), params={"orbitkv_retention": {"keep_for_s": 600}})
    assert counters(e)["hints_sent"] == 1
    m.settled_stats(hint_kept_blocks=before + e.tp * FULL_BLOCKS)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_engine_flow(model_dir: Path, qc_manager: ManagerProcess, tp: int) -> None:
    e = TPEngine.build(model_dir, str(qc_manager.socket_path), tp)
    try:
        cold_miss_then_full_hit(e, qc_manager)
        rank_missing_blocks_shrinks_the_hit(e, qc_manager)
        rank_save_failure_makes_a_miss_for_all(e, qc_manager)
        a_hint_reaches_every_shard(e, qc_manager)
        # The scheduler only looks up (control-only session); ranks save and restore.
        assert e.connector.scheduler_side.session.client().control_only
    finally:
        e.shutdown()
    assert_nothing_held(e, qc_manager)


def test_tp_rank_killed_mid_load_leaks_no_lease_and_serves_no_byte(
    model_dir: Path, qc_manager: ManagerProcess, tmp_path: Path
) -> None:
    m = qc_manager
    e = TPEngine.build(model_dir, str(m.socket_path), 2)
    try:
        run(e, PROMPT)
        e.reset_hbm()
        flag = tmp_path / "rank1-acquired"
        e.call("hang_loads", str(flag), ranks=[1])
        r = make_request(PROMPT)
        e.scheduler.add_request(r)
        e.step_admitting(r)
        eventually("rank 1 acquired its part", flag.exists)
        e.run_until(lambda: e.call("counters", ranks=[0])[0]["bytes_restored"] > 0, what="rank 0's load")
        # Rank 1's part, acquired, pins its shard (rank 0's quiet release may still be on its way).
        m.settled_stats(live_leases=1, live_tp_leases=1)
        e.kill(1)  # SIGKILL mid-copy
        # L2: the Manager holds rank 1's acquired part until the process is proven gone.
        eventually(
            "the killed rank's session released",
            lambda: m.stats()["sessions_unquarantined_total"] >= 1 and m.stats()["quarantined_sessions"] == 0,
        )
        for _ in range(5):
            e.step()
        # The request never runs on a partial restore: vLLM waits for every rank.
        assert e.scheduler.requests[r.request_id].status == RequestStatus.WAITING_FOR_REMOTE_KVS
        e.check_pages(r, FULL_BLOCKS * BLOCK, ranks=[0])  # rank 0's restore is exact
    finally:
        e.shutdown()  # the engine goes down with its rank: the scheduler's session ends
    eventually(
        "every lease and pin released",
        lambda: all(m.stats()[k] == 0 for k in ("live_leases", "live_tp_leases", "dram_pinned_blocks")),
    )
    assert m.stats()["dram_visible_blocks"] == 2 * FULL_BLOCKS, "the cache is intact"
    # A fresh engine restores every rank's shard byte for byte.
    e2 = TPEngine.build(model_dir, str(m.socket_path), 2)
    try:
        r2 = run(e2, PROMPT)
        assert counters(e2)["hit_blocks"] == FULL_BLOCKS and r2.request_id in e2.finished
    finally:
        e2.shutdown()
    assert_nothing_held(e2, m)


def test_tp_full_hit_through_the_copy_engine(model_dir: Path, qc_manager: ManagerProcess) -> None:
    """The same flow with every rank on `orbitkv.kvcopy` (asynchronous loads and saves,
    `orbitkv.copy_engine = "torch"` on CPU pages): each rank redeems, acquires its
    part's slots and copies through the engine; delayed frees until every rank reported."""
    e = TPEngine.build(model_dir, str(qc_manager.socket_path), 2, extra={"orbitkv.copy_engine": "torch"})
    try:
        assert all(w["bytes_restored"] == 0 for w in e.call("counters"))
        cold_miss_then_full_hit(e, qc_manager)
    finally:
        e.shutdown()
    assert_nothing_held(e, qc_manager)
