"""vLLM 0.34.0 against 0.33.0, as read from the released 0.34.0 sources.

Connector API (`kv_connector/v1/base.py`), additive only, no abstract method added:
  * `may_load_async(request)`: consulted only with `--max-num-inflight-kv-loads`
    (`Scheduler._enqueue_waiting_request`). **Overridden**: True for a request OrbitKV
    serves whose first block the presence table does not rule out, so vLLM looks it up
    and starts its load while the running batch is full (the base default names only
    P/D `do_remote_prefill` requests, so OrbitKV hits waited for a running slot first).
  * `supports_lookahead_block_hashes` (classmethod, False): kept; look-ahead hashes need
    EAGLE-like speculative decoding, which OrbitKV rejects, so the look-ahead stays 0.
  * `kv_cache_access` (classmethod, `IN_PROCESS`): kept; the workers copy KV pages with
    in-process kernels (the Manager's arena, not the KV cache, is host-registered).
  * The 0.33.0 hooks (per-tier hit sources, sleep mode) are unchanged and kept.
Model Runner V1 is gone (`VllmConfig.use_v2_model_runner` removed, and
`VLLM_USE_V2_MODEL_RUNNER=0` is an error). The V2 runner calls `handle_preemptions` from
`pre_forward`, after `update_requests` zeroed new blocks and applied copy-on-write copies on
the current stream, so a block a preempted request freed could be rewritten while a save
still reads it: on this release every step's saves are ordered before the next step's
device work (`SAVES_BEFORE_NEXT_STEP`).
The extensible KV cache (on by default on CUDA) reserves the KV cache as virtual memory
and commits pages as it grows; the connector is built after the final commit and, under
block-compact layer-outermost layouts, is handed each layer over a storage of its own (that
layer's committed segment, at the offset it has in one allocation). The page geometry takes
one storage per layer (`orbitkv.vllm.layout.block_geometry`: pages in address order, the
same cached block format as one allocation), and the copy engine addresses each layer's
pages from its own storage, so it is accepted. Sleep mode releases the physical pages only
after `unregister_kv_caches` has drained every copy.
The default block size on CUDA is 64 tokens (was 16; CPU keeps its own); a block size is
part of the namespace, so blocks saved with 16-token blocks are a clear miss.
`Request.skip_reading_prefix_cache` became `skip_reading_external_kv` (the adapter reads
neither); `Request.prompt_token_ids` is a `TokenBuffer` (not read).
Unchanged for the adapter: block hashing (byte-identical digests for the same prompt),
`KVConnectorOutput`, `KVConnectorTransferResults`, `KVConnectorWorkerMetadata`,
`KVConnectorStats`, the factory's module-path loading, `kv_load_failure_policy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orbitkv.vllm.compat import v0_33_0

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

VERSION = "0.34.0"

# The V2 runner zeroes and copies blocks before it reports preemptions (see above).
SAVES_BEFORE_NEXT_STEP = True


class ConnectorHooks(v0_33_0.ConnectorHooks):
    """The hooks 0.34.0 shares with 0.33.0 (per-tier hit sources, sleep mode), and
    `may_load_async`."""

    def may_load_async(self, request: Request) -> bool:
        return self.scheduler_side.may_load_async(request)


def check_profile(vllm_config: VllmConfig) -> None:
    """Nothing of 0.34.0's own to reject: its extensible KV cache is taken (see above)."""
    del vllm_config
