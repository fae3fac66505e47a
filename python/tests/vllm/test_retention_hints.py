"""Retention hints through the released vLLM Scheduler (issue 31, L2). An application
passes `kv_transfer_params={"orbitkv_retention": {...}}` with a request; the connector
sends the hint for the request's block chain when it finishes.

- A conversation that continues (`keep_for_s`) outlives a flood of other prefixes that
  evicts an unhinted prompt saved at the same time: a fresh engine loads it whole,
  byte-exact, and recomputes the unhinted one.
- A finished conversation (`done`) is marked for the Manager to evict first.
- A malformed hint is refused with its reason in the log, counted, and the request runs
  (and is cached) as if it had none.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import logging
import os
from pathlib import Path

import pytest
from engine_manager import manager_in_short_dir
from hint_cases import MALFORMED_HINTS
from vllm.v1.request import RequestStatus
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.native]

KEPT = prompt_tokens(100, seed=310)  # 6 full blocks + 4 tokens
PLAIN = prompt_tokens(100, seed=311)
FULL_BLOCKS = len(KEPT) // BLOCK


def run_one(e: Engine, prompt: list[int], **kw: object) -> str:
    r = make_request(prompt, **kw)  # type: ignore[arg-type]
    e.scheduler.add_request(r)
    e.run_to_completion([r.request_id])
    return r.request_id


def test_a_kept_conversation_outlives_a_flood_that_evicts_an_unhinted_prompt(model_dir: Path, tmp_path: Path) -> None:
    with manager_in_short_dir(tmp_path / "m", "okv-hint", dram_size="16MiB") as m:
        a = Engine.build(make_vllm_config(model_dir, socket_path=str(m.socket_path)))
        run_one(a, KEPT, kv_transfer_params={"orbitkv_retention": {"keep_for_s": 600}})
        run_one(a, PLAIN)
        c = a.connector.scheduler_side.counters
        assert (c["hints_sent"], c["hints_rejected"]) == (1, 0)
        block_bytes = a.connector.block_bytes
        a.shutdown()
        st = m.settled_stats(live_leases=0, live_saves=0)
        assert st["hint_requests_total"] == 1
        # Every full block of the request (the prompt's and the decoded ones' complete
        # blocks) was kept, at once or when its save committed.
        assert st["hint_kept_blocks"] >= FULL_BLOCKS and st["hint_refused_blocks_total"] == 0

        # Another application floods the arena with twice its size in new prefixes.
        dram = 16 << 20
        n = 2 * dram // block_bytes
        with m.client() as cl:
            ns = cl.register_namespace(b"f" * 32, block_bytes)
            for i in range(0, n, 8):
                chain = [bytes([i // 8 % 256, i // 2048, j]) + bytes(29) for j in range(8)]
                cl.save(ns, chain, os.urandom(8 * block_bytes))
        st = m.stats()
        assert st["evictions_total"] >= n // 2, "the flood evicted"

        b = Engine.build(make_vllm_config(model_dir, socket_path=str(m.socket_path)))
        r = make_request(KEPT)
        b.scheduler.add_request(r)
        so = b.schedule_admitting(r)
        assert b.status(r.request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS
        b.execute(so)
        b.run_until(
            lambda: b.scheduler.requests[r.request_id].num_computed_tokens >= len(KEPT),
            what="the prefill after the load",
        )
        b.check_pages(r, len(KEPT))  # the kept prefix, loaded byte-exact
        b.run_to_completion([r.request_id])
        cb = b.connector.scheduler_side.counters
        assert (cb["hit_blocks"], cb["loads_finished"], cb["loads_failed"]) == (FULL_BLOCKS, 1, 0)
        run_one(b, PLAIN)
        assert b.connector.scheduler_side.counters["hit_blocks"] == FULL_BLOCKS, "the unhinted prompt was evicted"
        b.assert_drained()
        b.shutdown()


def test_done_marks_the_conversation_to_leave_first(model_dir: Path, tmp_path: Path) -> None:
    with manager_in_short_dir(tmp_path / "m", "okv-hintd") as m:
        e = Engine.build(make_vllm_config(model_dir, socket_path=str(m.socket_path)))
        run_one(e, KEPT, kv_transfer_params={"orbitkv_retention": {"done": True}})
        assert e.connector.scheduler_side.counters["hints_sent"] == 1
        e.shutdown()
        st = m.settled_stats(live_leases=0, live_saves=0)
        assert st["hint_done_blocks"] >= FULL_BLOCKS and st["hint_kept_blocks"] == 0


@pytest.mark.parametrize(("hint", "reason"), MALFORMED_HINTS)
def test_a_malformed_hint_is_refused_with_its_reason_and_the_request_runs(
    model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, hint: object, reason: str
) -> None:
    with manager_in_short_dir(tmp_path / "m", "okv-hintx") as m:
        e = Engine.build(make_vllm_config(model_dir, socket_path=str(m.socket_path)))
        with caplog.at_level(logging.ERROR, logger="orbitkv.vllm"):
            run_one(e, KEPT, kv_transfer_params={"orbitkv_retention": hint})
        c = e.connector.scheduler_side.counters
        assert (c["hints_rejected"], c["hints_sent"]) == (1, 0)
        assert any(reason in rec.getMessage() and "orbitkv_retention" in rec.getMessage() for rec in caplog.records)
        assert c["saved_blocks"] >= FULL_BLOCKS, "the request was cached as without a hint"
        e.shutdown()
        st = m.settled_stats(live_leases=0, live_saves=0)
        assert st["hint_requests_total"] == 0
