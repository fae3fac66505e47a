"""vLLM 0.33.0 against 0.31.0, as read from the installed 0.33.0 sources.

Connector API (`kv_connector/v1/base.py`), additive only, no abstract method added:
  * `get_external_cache_hit_sources(request, num_external_tokens)`: called by the
    Scheduler after `update_state_after_alloc`, for Prometheus hit counts by tier. OrbitKV
    answers from the lookup's lease: blocks the Manager held in DRAM count as `HOST`, the
    blocks it had on SSD only (`Lease.ssd_blocks`) as `DISK`.
  * `supports_sleep_mode` (classmethod) + `unregister_kv_caches` / `restore_kv_caches`
    around `Worker.sleep` / `wake_up` / `discard`: supported; the worker drains every copy
    before vLLM releases the KV memory and refuses transfers until it is restored.
  * `get_loaded_kv_cache_group_ids`: the default (the prefix-cacheable groups) is right
    for OrbitKV's single full-attention group; not overridden.
Unchanged for the adapter: block hashing (`get_request_block_hasher` only gained
`num_hash_lookahead_tokens`, which is 0 whenever a KV connector is configured), `Request`,
`KVConnectorOutput`, `KVConnectorTransferResults`, `KVConnectorWorkerMetadata`,
`KVConnectorStats`, the factory, `allocate_kv_cache`, the layouts. `SchedulerOutput` lost
`block_table_updates` and made `num_common_prefix_blocks` a defaulted field (the adapter
reads neither). `KVTransferConfig` dropped `kv_buffer_size`, `kv_rank`,
`kv_parallel_size`, `kv_ip` (the adapter reads none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.metrics.cache_hit_source import CacheHitSource

from orbitkv.vllm.compat import v0_31_0

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.v1.request import Request

VERSION = "0.33.0"

SAVES_BEFORE_NEXT_STEP = False


class ConnectorHooks:
    """The 0.33.0-only hooks of `OrbitKVConnector` (the mixin precedes the base class)."""

    # What the base class's default `get_external_cache_hit_sources` would report;
    # overridden below with the DRAM/SSD split.
    _cache_hit_source = CacheHitSource.HOST

    scheduler_side: Any
    worker_side: Any

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        if num_external_tokens <= 0:
            return {}
        dram, ssd = self.scheduler_side.hit_tiers(request, num_external_tokens)
        sources = {CacheHitSource.HOST: dram, CacheHitSource.DISK: ssd}
        return {k: v for k, v in sources.items() if v}

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return True

    def unregister_kv_caches(self) -> None:
        self.worker_side.unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        self.worker_side.restore_kv_caches()


def check_profile(vllm_config: VllmConfig) -> None:
    """0.33.0 still has both model runners; OrbitKV is qualified on V1 there."""
    v0_31_0.require_v1_runner(vllm_config)
