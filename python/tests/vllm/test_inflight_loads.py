"""vLLM 0.34.0's `--max-num-inflight-kv-loads` with OrbitKV's `may_load_async`: a request
whose KV OrbitKV holds is looked up and loaded while the running batch is full, so it
runs as soon as a slot frees; without the override (vLLM's default answer, P/D only) it
waits for a slot before its lookup even starts. The released Scheduler on CPU pages, a
real Manager process, byte-exact pages."""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import time
from pathlib import Path
from typing import Any

import pytest
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config
from vllm_harness import prompt_tokens as tokens

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.native,
    pytest.mark.skipif(vllm.__version__ != "0.34.0", reason="--max-num-inflight-kv-loads is new in vLLM 0.34.0"),
]

HIT = tokens(6 * BLOCK + 3, seed=341)  # 6 full blocks OrbitKV will hold
BUSY = tokens(40, seed=342)  # the request that keeps the batch full (a miss)


def _config(model_dir: Path, manager: ManagerProcess, **kw: Any) -> Any:
    return make_vllm_config(model_dir, socket_path=str(manager.socket_path), **kw)


def _save_hit(model_dir: Path, manager: ManagerProcess) -> None:
    a = Engine.build(_config(model_dir, manager))
    r = make_request(HIT)
    a.scheduler.add_request(r)
    a.run_to_completion([r.request_id])
    a.run_until_drained()
    assert a.connector.scheduler_side.counters["saved_blocks"] >= len(HIT) // BLOCK
    a.shutdown()


def _busy_engine(model_dir: Path, manager: ManagerProcess) -> tuple[Engine, Any]:
    """A fresh engine with one running slot, taken by a long miss."""
    e = Engine.build(_config(model_dir, manager, max_num_seqs=1, scheduler={"max_num_inflight_kv_loads": 2}))
    busy = make_request(BUSY, max_tokens=400)
    e.scheduler.add_request(busy)
    e.run_until(lambda: e.status(busy.request_id) == RequestStatus.RUNNING, what="busy running")
    return e, busy


def test_a_hit_loads_while_the_batch_is_full_and_runs_when_a_slot_frees(
    model_dir: Path, orbit_manager: ManagerProcess
) -> None:
    _save_hit(model_dir, orbit_manager)
    e, busy = _busy_engine(model_dir, orbit_manager)
    hit = make_request(HIT, max_tokens=2)
    assert e.connector.may_load_async(hit), "OrbitKV holds its first block"
    e.scheduler.add_request(hit)
    # While `busy` holds the only running slot, the hit's lookup and load complete (a
    # worker reports it in finished_recving): it waits for a slot with its KV in place.
    received: set[str] = set()
    for _ in range(300):
        if hit.request_id in received:
            break
        received |= set(e.step().kv_output.finished_recving or ())
        time.sleep(0.005)  # the lookup and the copy run on background threads
    assert hit.request_id in received, "the hit's load did not complete while the batch was full"
    assert e.status(busy.request_id) == RequestStatus.RUNNING and busy.request_id not in e.finished
    assert e.connector.scheduler_side.counters["hit_blocks"] == len(HIT) // BLOCK
    # Once the busy request finishes, the hit runs at once, with the loaded prefix.
    e.run_to_completion([busy.request_id])
    steps_after_busy = e.run_until(
        lambda: (
            (q := e.scheduler.requests.get(hit.request_id)) is not None
            and q.status == RequestStatus.RUNNING
            and q.num_computed_tokens >= len(HIT)
        ),
        what="the hit's prefill",
    )
    e.check_pages(hit, len(HIT))
    assert len(steps_after_busy) <= 2, "no lookup or load left to wait for once a slot freed"
    e.run_to_completion([hit.request_id])
    e.run_until_drained()
    e.assert_drained()
    e.shutdown()


def test_without_the_override_a_hit_waits_for_a_slot_before_its_lookup(
    model_dir: Path, orbit_manager: ManagerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline of the test above: vLLM's default `may_load_async` (False for
    anything but P/D remote prefill) keeps the hit in the ordinary queue."""
    _save_hit(model_dir, orbit_manager)
    e, busy = _busy_engine(model_dir, orbit_manager)
    monkeypatch.setattr(type(e.connector), "may_load_async", KVConnectorBase_V1.may_load_async)
    hit = make_request(HIT, max_tokens=2)
    e.scheduler.add_request(hit)
    for _ in range(20):
        e.step()
        time.sleep(0.005)
    assert e.status(busy.request_id) == RequestStatus.RUNNING
    assert e.status(hit.request_id) == RequestStatus.WAITING
    assert e.connector.scheduler_side.counters["lookups"] == 0, "not even looked up while the batch is full"
    e.run_to_completion([busy.request_id, hit.request_id])
    e.run_until_drained()
    e.shutdown()
