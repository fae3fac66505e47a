"""The remote tier under the released vLLM Scheduler (issue 30, L2): two real Managers
with separate arenas share one real Redis Cluster (3 masters + 3 replicas on loopback,
`scripts/redis-cluster.sh`). An engine behind Manager A computes a prompt and saves it;
A writes the blocks behind to the cluster. A fresh engine behind Manager B, which never
saw the prompt, loads the whole prefix: B reads it from the cluster on its local miss,
and the engine's pages are byte-exact without recomputing them.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import time
from pathlib import Path

import pytest
from engine_manager import manager_in_short_dir
from redis_cluster import redis_cluster
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.native]

PROMPT = prompt_tokens(100, seed=30)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK


def wait_stat(m: ManagerProcess, name: str, at_least: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        v = int(m.stats()[name])
        if v >= at_least or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


def test_a_prefix_saved_behind_one_manager_loads_behind_another_from_the_cluster(
    model_dir: Path, tmp_path: Path
) -> None:
    with (
        redis_cluster(21340) as cluster,
        manager_in_short_dir(tmp_path / "a", "okv-ra", extra_args=cluster.manager_args()) as ma,
        manager_in_short_dir(tmp_path / "b", "okv-rb", extra_args=cluster.manager_args()) as mb,
    ):
        a = Engine.build(make_vllm_config(model_dir, socket_path=str(ma.socket_path)))
        r = make_request(PROMPT)
        a.scheduler.add_request(r)
        a.run_to_completion([r.request_id])
        a.shutdown()
        puts = wait_stat(ma, "remote_puts_total", FULL_BLOCKS)
        assert puts >= FULL_BLOCKS, f"A wrote {puts} of {FULL_BLOCKS} blocks to the cluster"

        b = Engine.build(make_vllm_config(model_dir, socket_path=str(mb.socket_path)))
        r = make_request(PROMPT)
        b.scheduler.add_request(r)
        so = b.schedule_admitting(r)  # the step that parks it for its load; executed below
        assert b.status(r.request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS
        b.execute(so)
        b.run_until(
            lambda: b.scheduler.requests[r.request_id].num_computed_tokens >= len(PROMPT),
            what="the prefill after the load",
        )
        b.check_pages(r, len(PROMPT))  # 96 tokens loaded from the cluster through B, 4 computed
        b.run_to_completion([r.request_id])
        c = b.connector.scheduler_side.counters
        assert (c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (FULL_BLOCKS, 1, 0)
        assert b.worker.worker_side.counters["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
        b.assert_drained()
        b.shutdown()
        st = mb.stats()
        assert st["remote_filled_blocks_total"] == FULL_BLOCKS, "B's hit came from the cluster"
        assert st["remote_invalid_total"] == 0 and st["remote_errors_total"] == 0
        mb.settled_stats(live_leases=0, live_saves=0)
