"""`OrbitKVConnector`: vLLM 0.31.0 / 0.33.0 KV Connector V1 for OrbitKV (contracts V1-V4).

Load it with::

    --kv-transfer-config '{"kv_connector": "OrbitKVConnector",
                           "kv_connector_module_path": "orbitkv.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"orbitkv.socket_path": "..."}}'

vLLM builds one instance per role. The instance constructs only its role's object
(`OrbitKVScheduler` or `OrbitKVWorker`); the other role's module is never imported.
Profile guards run in the constructor, before anything connects to the Manager.
Hooks that exist in one release only come from that release's `compat` module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)

import orbitkv.vllm.compat as compat
from orbitkv.engine.identity import fingerprint
from orbitkv.vllm.config import OrbitKVSettings, parse_settings
from orbitkv.vllm.failures import ensure_recompute_policy
from orbitkv.vllm.metadata import OrbitKVConnectorMetadata
from orbitkv.vllm.native import ManagerSession
from orbitkv.vllm.profile import block_bytes, check_profile, identity_document
from orbitkv.vllm.stats import OrbitKVConnectorStats, OrbitKVPromMetrics
from orbitkv.vllm.tp import worker_tp_rank

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from orbitkv.vllm.scheduler import OrbitKVScheduler
    from orbitkv.vllm.worker import OrbitKVWorker


#: The connector methods vLLM's scheduler calls (its scheduler side), for
#: measuring what the connector costs the scheduler (benches/vllm_overhead.py,
#: the GPU engine suite's driver).
SCHEDULER_METHODS = (
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
)


if TYPE_CHECKING:
    # Checked against the newest pin's hooks: every older pin's are a subset of them.
    from orbitkv.vllm.compat.v0_34_0 import ConnectorHooks as _ConnectorHooks
else:
    _ConnectorHooks = compat.current().ConnectorHooks


class OrbitKVConnector(_ConnectorHooks, KVConnectorBase_V1):
    """Not `SupportsHMA`: vLLM turns the hybrid allocator off, one KV group remains.
    The release's own hooks (`compat.<pin>.ConnectorHooks`) come first in the MRO."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.settings: OrbitKVSettings = parse_settings(extra)
        spec = check_profile(vllm_config, kv_cache_config, self.settings)
        # Before the Scheduler reads it (right after this constructor returns): L7.
        ensure_recompute_policy(vllm_config, self.settings, log=role == KVConnectorRole.SCHEDULER)
        self.identity = identity_document(vllm_config, kv_cache_config, spec, self.settings)
        self.fingerprint = fingerprint(self.identity)
        self.block_bytes = block_bytes(kv_cache_config, spec)
        # Both roles derive the copy path from the same settings and device config: the
        # scheduler must know whether saves complete after the step (delayed frees).
        self.kvcopy = self.settings.uses_kvcopy(vllm_config.device_config.device_type)
        # The scheduler never copies: its session is control-only (no arena mapping,
        # no page tables or prefault; the Manager drops its leases with its connection)
        # and its calls are bounded by the shorter scheduler timeout.
        scheduler = role == KVConnectorRole.SCHEDULER
        # K1/T1: a worker's KV shard is its TP rank; the scheduler names every shard.
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        session = ManagerSession(
            self.settings,
            self.fingerprint,
            self.block_bytes,
            map_arena=not scheduler,
            timeout_ms=self.settings.scheduler_timeout_ms if scheduler else self.settings.timeout_ms,
            shard=0 if scheduler else worker_tp_rank(vllm_config.parallel_config),
            shards=tp_size,
            # orbitkv.kvcopy copies through the main connection's pinned mapping: the
            # loads' connection (ManagerSession.loader) needs no page tables of its own.
            prefault_loader=not self.kvcopy,
        )
        self._scheduler: OrbitKVScheduler | None = None
        self._worker: OrbitKVWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            mod = importlib.import_module("orbitkv.vllm.scheduler")
            self._scheduler = mod.OrbitKVScheduler(
                self.settings, session, vllm_config.cache_config.block_size, async_saves=self.kvcopy
            )
        else:
            mod = importlib.import_module("orbitkv.vllm.worker")
            self._worker = mod.OrbitKVWorker(self.settings, session, kv_cache_config.num_blocks, kvcopy=self.kvcopy)

    # ---- role access ---------------------------------------------------------------

    @property
    def scheduler_side(self) -> OrbitKVScheduler:
        if self._scheduler is None:
            raise RuntimeError("scheduler-side method called on a worker-role OrbitKVConnector")
        return self._scheduler

    @property
    def worker_side(self) -> OrbitKVWorker:
        if self._worker is None:
            raise RuntimeError("worker-side method called on a scheduler-role OrbitKVConnector")
        return self._worker

    def _meta(self) -> OrbitKVConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, OrbitKVConnectorMetadata)
        return meta

    # ---- class-level hooks ---------------------------------------------------------

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        ktc = vllm_config.kv_transfer_config
        extra = ktc.kv_connector_extra_config if ktc is not None else {}
        return parse_settings(extra).kv_cache_layout

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # FULL CUDA graphs are safe: the per-layer hooks (wait_for_layer_load,
        # save_kv_layer) are no-ops that a replay may skip, and every copy is issued by
        # start_load_kv / wait_for_save / handle_preemptions, which vLLM runs outside
        # the graphs (the copy engine raises if asked to copy during a capture).
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is only a future miss

    # ---- worker side ---------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker_side.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.worker_side.start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous: a request runs only after its load was reported
        # complete, so no layer of a running request is ever still being restored.
        self.worker_side.wait_for_layer_load(layer_name)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, OrbitKVConnectorMetadata)
        self.worker_side.handle_preemptions(kv_connector_metadata)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return None  # whole blocks are saved in wait_for_save, after every layer ran

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            self.worker_side.save(self._meta())

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        return self.worker_side.get_transfer_results(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker_side.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self.worker_side.build_worker_meta()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        side = self._scheduler if self._scheduler is not None else self._worker
        return side.connector_stats() if side is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return OrbitKVConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return OrbitKVPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()

    # ---- scheduler side ------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self.scheduler_side.on_new_request(request)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self.scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler_side.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler_side.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler_side.request_finished(request, block_ids)

    def reset_cache(self) -> bool | None:
        return self.scheduler_side.reset_cache()
