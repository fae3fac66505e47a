"""The OrbitKV linker for SGLang 0.5.21's `UnifiedRadixCache` (contracts S1, S2, L1-L3, K3, K4).

Selected by `--radix-cache-backend orbitkv` (with `--enable-unified-cache-external-linker`,
which makes the scheduler drive the linker's events). `build_tree_cache` checks the
profile, builds the released `UnifiedRadixCache` with the FULL component only, and
attaches `OrbitKVLinker` exactly as the release attaches its built-in linkers
(`init_cache_linker` plus the layer-counter registrations). SGLang keeps the tree, the
locks and page allocation (O1); OrbitKV answers lookups, loads, offloads, reset and close.

Block keys are SGLang's own per-page storage hashes (64-hex SHA-256 chain, seeded by the
request's `extra_key` (which carries the LoRA id) and `cache_salt`), used as the 32-byte
OrbitKV block hash. A cached block is, for each layer in order, the layer's page bytes
(MHA: K then V of layer 0, K then V of layer 1, ...; MLA: the latent page).

**0.5.21 load semantics.** `load_back` inserts the restored pages into the tree *before*
the load runs, and a `cancel_queued_load` that returns True leaves never-loaded pages in
the tree. So this linker makes everything that can fail happen in `lookup` (the Manager
lookup *and* the staging of the hit into the shared arena, under a lease); a queued load
is then only a copy from the mapped arena into the pages, which no Manager failure can
stop (the mapping outlives a dead Manager). `cancel_queued_load` never cancels: it
releases a lookup lease that was not consumed and returns False for a queued load, which
runs and completes normally.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolTransfer
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from orbitkv.sglang import BACKEND_NAME
from orbitkv.sglang._shared import (
    EXTRA_KEY_REJECTED,
    LinkerCore,
    PoolGeometry,
    UnsupportedProfileError,
    caller_extra_key,
    describe_pool,
    logger,
    lora_identity,
    namespace_for,
    refuse_first,
    request_feature_checks,
    require_release,
    screen_match,
)
from orbitkv.sglang.config import SGLangSettings, parse_settings
from orbitkv.sglang.retention import request_hint, send_hint

PINNED_SGLANG = "0.5.21"

__all__ = [
    "EXTRA_KEY_REJECTED",
    "OrbitKVLinker",
    "OrbitKVRadixCache",
    "PoolGeometry",
    "UnsupportedProfileError",
    "build_tree_cache",
    "caller_extra_key",
    "check_profile",
    "describe_pool",
    "lora_identity",
]


class OrbitKVLinker(LinkerCore, UnifiedCacheLinker):
    """`UnifiedCacheLinker` (0.5.21) over an OrbitKV Manager. Driven from the scheduler thread."""

    def num_completed_loads(self) -> int:
        # Called once per scheduler step (check_hicache_events), never inside a match.
        self._sweep_unselected()
        n = 0
        for batch in self._batches:
            if not all(h.query() for h in batch.handles):
                break
            n += 1
        return n

    def pop_completed_load(self) -> list[str]:
        batch = self._batches.popleft()
        for ld in batch.loads:
            self._release(ld.query)
        return [ld.rid for ld in batch.loads]

    def cancel_queued_load(self, rid: str) -> bool:
        # Never cancel for real on 0.5.21: a cancelled load's pages stay in the tree
        # unloaded. A queued load runs and completes; an unconsumed lookup lease is freed.
        self._release_query(rid)
        if any(ld.rid == rid for ld in self._queued):
            self.stats["cancel_refused"] += 1
        return False

    def offload(self, transfers: list[PoolTransfer]) -> bool:
        return self._offload(transfers)


class OrbitKVRadixCache(UnifiedRadixCache):
    """The released `UnifiedRadixCache` plus one guard (K3): a request with a caller
    `extra_key` is rejected at its first match (see `_shared.screen_match`); it is
    never looked up in OrbitKV, and nothing it computes is inserted or offloaded.
    And a finished request's retention hint (`orbitkv.sglang.retention`) is sent for
    the page chain its insert ended on. Everything else is the released class."""

    orbitkv_linker: OrbitKVLinker
    # The first insert of the `insert_req` running now (its whole page-aligned key; the
    # release's second insert is the prompt alone): the node a hint's chain ends on.
    _orbitkv_insert: list[Any] | None = None

    def match_prefix(self, params: Any) -> Any:
        return super().match_prefix(screen_match(self.orbitkv_linker, params))

    def insert(self, params: Any) -> Any:
        result = super().insert(params)
        if self._orbitkv_insert is not None and not self._orbitkv_insert:
            self._orbitkv_insert.append(result)
        return result

    def insert_req(self, req: Any, **kwargs: Any) -> Any:
        hint = request_hint(self.orbitkv_linker, req)
        self._orbitkv_insert = [] if hint is not None else None
        try:
            with _suppress(self.orbitkv_linker, caller_extra_key(req)):
                out = super().insert_req(req, **kwargs)
            inserted = self._orbitkv_insert
        finally:
            self._orbitkv_insert = None
        if hint is not None and inserted and not getattr(inserted[0], "rotation_tail_declined", False):
            send_hint(self.orbitkv_linker, self, req, hint, inserted[0].last_device_node)
        return out

    def cache_unfinished_req(self, req: Any, **kwargs: Any) -> Any:
        with _suppress(self.orbitkv_linker, caller_extra_key(req)):
            return super().cache_unfinished_req(req, **kwargs)


class _suppress:
    def __init__(self, linker: OrbitKVLinker, on: bool) -> None:
        self.linker, self.on, self.before = linker, on, False

    def __enter__(self) -> None:
        self.before = self.linker.suppress_offload
        self.linker.suppress_offload = self.before or self.on

    def __exit__(self, *exc: object) -> None:
        self.linker.suppress_offload = self.before


def check_profile(ctx: Any) -> None:
    """Reject every setting the adapter cannot serve, naming it (before any Manager call)."""
    from sglang.srt.runtime_context import get_disagg, get_memory

    require_release(__name__, PINNED_SGLANG)
    mem = get_memory()
    checks: list[tuple[bool, str]] = [
        (
            not mem.enable_unified_cache_external_linker,
            "--radix-cache-backend orbitkv needs --enable-unified-cache-external-linker "
            "(the scheduler drives linker loads and completions only with it)",
        ),
        (bool(ctx.enable_hierarchical_cache), "--enable-hierarchical-cache (HiCache host tier) is not supported"),
        (bool(ctx.disable_radix_cache), "--disable-radix-cache leaves nothing to link"),
        (bool(ctx.is_hybrid_swa), "hybrid sliding-window models (SWA component) are not supported"),
        (bool(ctx.is_hybrid_ssm), "hybrid recurrent (Mamba/SSM) models are not supported"),
        (bool(getattr(ctx, "is_dsa", False)), "DSA (sparse-attention indexer) models are not supported"),
        *request_feature_checks(ctx.params, mem),
        (
            get_disagg().disaggregation_mode not in (None, "null"),
            f"--disaggregation-mode {get_disagg().disaggregation_mode}: P/D with OrbitKV is not qualified "
            "(SGLang's own disaggregation, with OrbitKV restoration off on decode, is the S3 design)",
        ),
        (int(ctx.tp_size) != 1, f"--tp-size {ctx.tp_size}: only TP=1 is qualified"),
        (int(ctx.params.pp_size) != 1, f"pipeline parallelism (pp_size={ctx.params.pp_size}) is not qualified"),
        (int(ctx.params.attn_cp_size) != 1, "attention context parallelism is not qualified"),
    ]
    refuse_first("backend", checks)


def build_tree_cache(ctx: Any, settings: SGLangSettings | None = None) -> OrbitKVRadixCache:
    """The `--radix-cache-backend orbitkv` factory for sglang 0.5.21."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    check_profile(ctx)
    settings = settings if settings is not None else parse_settings()
    params = ctx.params
    kvcache = params.token_to_kv_pool_allocator.get_kvcache()
    geometry = describe_pool(kvcache, int(params.page_size))
    fp = namespace_for(PINNED_SGLANG, ctx.server_args, settings, geometry, (ctx.tp_rank, ctx.tp_size), params)
    params.tree_components = (ComponentType.FULL,)
    cache = OrbitKVRadixCache(params)
    linker = OrbitKVLinker(settings, fp, geometry)
    linker.page_size = int(params.page_size)
    cache.orbitkv_linker = linker
    cache.init_cache_linker(linker)
    linker.wrapper = cache.linker
    kvcache.register_layer_transfer_counter(linker.layer_done_counter)
    ctx.tp_worker.register_hicache_layer_transfer_counter(linker.layer_done_counter)
    logger.info(
        "orbitkv: %s backend on a %s pool (%d pages of %d bytes per block), namespace %s",
        BACKEND_NAME,
        geometry.kind,
        geometry.num_pages,
        geometry.block_bytes,
        fp.hex()[:16],
    )
    return cache
