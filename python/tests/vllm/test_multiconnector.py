"""OrbitKV composed in vLLM's released MultiConnector (V4, V5).

Decode side of P/D: NixlConnector (kv_consumer) owns the incoming KV on the wire and
OrbitKV runs `save_only`. Scheduler-level only: NIXL's worker needs the nixl runtime
and an RDMA-capable peer, which a CPU box does not have, so the completion NIXL would
report is fed to the real Scheduler directly; every decision checked here is made by
the released MultiConnector/NixlConnector/Scheduler code and by OrbitKV.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

from pathlib import Path

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_harness import (
    BLOCK,
    make_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    prompt_tokens,
    runner_output,
)

from orbitkv.vllm.metadata import OrbitKVConnectorMetadata

pytestmark = pytest.mark.vllm

PROMPT = prompt_tokens(100, seed=11)


def _decode_side_scheduler(model_dir: Path) -> Scheduler:
    extra = {
        "connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
            {
                "kv_connector": "OrbitKVConnector",
                "kv_connector_module_path": "orbitkv.vllm",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "orbitkv.mode": "save_only",
                    "orbitkv.socket_path": "/nonexistent/decode-side.sock",
                },
            },
        ]
    }
    cfg = make_vllm_config(model_dir, kv_connector="MultiConnector", module_path=None, extra=extra)
    kc = make_kv_cache_config(128, "LBNHC")
    cfg.cache_config.num_gpu_blocks = 128
    return make_scheduler(cfg, kc)


def _output(so, sched: Scheduler, finished_recving: set[str] | None = None) -> ModelRunnerOutput:  # type: ignore[no-untyped-def]
    req_ids = list(so.num_scheduled_tokens)
    sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in req_ids]
    return runner_output(req_ids, sampled, KVConnectorOutput(finished_recving=finished_recving or set()))


def _orbit_meta(so) -> OrbitKVConnectorMetadata:  # type: ignore[no-untyped-def]
    meta = so.kv_connector_metadata.metadata[1]
    assert isinstance(meta, OrbitKVConnectorMetadata)
    return meta


def test_decode_side_nixl_loads_orbitkv_only_saves(model_dir: Path) -> None:
    sched = _decode_side_scheduler(model_dir)
    nixl, orbit = sched.connector._connectors
    assert type(nixl).__name__.startswith("Nixl") and type(orbit).__name__ == "OrbitKVConnector"
    side = orbit.scheduler_side

    # A P/D request: NIXL claims the remote prefill, OrbitKV neither queries nor loads.
    r = make_request(PROMPT, max_tokens=2)
    r.kv_transfer_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-engine",
        "remote_request_id": "prefill-" + r.request_id,
        "remote_block_ids": list(range(len(PROMPT) // BLOCK + 1)),
        "remote_host": "127.0.0.1",
        "remote_port": 1,
        "tp_size": 1,
    }
    sched.add_request(r)
    so = sched.schedule()
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert _orbit_meta(so).loads == [] and side.counters["lookups"] == 0
    assert not side.session.connected  # save_only never talks to the Manager here
    sched.update_from_output(so, _output(so, sched, finished_recving={r.request_id}))

    # NIXL delivered; the request computes its tail and OrbitKV saves its full blocks,
    # including the ones NIXL wrote (the decode side caches what it holds).
    saved: list[int] = []
    for _ in range(20):
        so = sched.schedule()
        meta = _orbit_meta(so)
        assert meta.loads == []
        saved += [b for spec in meta.saves for b in spec.block_ids]
        sched.update_from_output(so, _output(so, sched))
        if not sched.requests:
            break
    assert not sched.requests
    assert len(saved) == len(PROMPT) // BLOCK and len(set(saved)) == len(saved)

    # A plain request: NIXL has nothing, OrbitKV (save_only) is not asked either.
    plain = make_request(prompt_tokens(70, seed=12), max_tokens=2)
    sched.add_request(plain)
    so = sched.schedule()
    assert plain.status == RequestStatus.RUNNING
    assert side.counters["lookups"] == 0
    assert sum(len(s.block_ids) for s in _orbit_meta(so).saves) == 70 // BLOCK
    sched.update_from_output(so, _output(so, sched))
    assert side.tracked_requests == 1
    sched.finish_requests(plain.request_id, RequestStatus.FINISHED_ABORTED)
    assert side.tracked_requests == 0
