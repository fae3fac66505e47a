"""The OrbitKV linker for SGLang 0.5.23's `UnifiedRadixCache` (contracts S1, S2, L1-L3, K3, K4).

0.5.23 selects an out-of-tree linker through its **dynamic linker backend** (and refuses
`--radix-cache-backend` together with `--enable-unified-cache-external-linker`):

    --enable-unified-cache-external-linker --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker": "OrbitKVLinker",
        "linker_module_path": "orbitkv.sglang.v0_5_23",
        "linker_extra_config": {"orbitkv.socket_path": "..."}}'

SGLang then builds its stock `UnifiedRadixCache` and constructs
`OrbitKVLinker(server_args, params, components=..., extra_config=..., forward_stream=...)`
in each scheduler process; the settings are `linker_extra_config` (same keys as
`ORBITKV_SGLANG_CONFIG`, which is used when `linker_extra_config` is empty).

Differences from 0.5.21 (verified against the installed 0.5.23 source):
- the ABC: `finish_layer_wise_loading(counter_index) -> bool` replaces
  `num_completed_loads`/`pop_completed_load`; `offload(transfers, session_id=None)`;
  `pools` and `forward_stream` attributes;
- loads land in request-private slots and join the tree only after the request's
  forward, so `cancel_queued_load` really cancels a load that has not started;
- a load that does not land aborts its request with HTTP 503, so lookups still stage
  (see `_shared`): a started load is only a copy from the mapped arena;
- the caller-`extra_key` rejection (K3) is an AROUND hook on
  `UnifiedRadixCache.match_prefix` registered through SGLang's public plugin
  `HookRegistry` by the entry point (`orbitkv.sglang.plugin`), active only on a cache
  whose linker is this class; retention hints are sent from an AROUND hook on
  `UnifiedRadixCache.checkpoint` registered the same way.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

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

PINNED_SGLANG = "0.5.23"
LINKER_CONFIG_HINT = (
    "--enable-unified-cache-external-linker --unified-cache-external-linker-backend dynamic "
    '--unified-cache-external-linker-config \'{"linker": "OrbitKVLinker", '
    '"linker_module_path": "orbitkv.sglang.v0_5_23", "linker_extra_config": {...}}\''
)

__all__ = [
    "EXTRA_KEY_REJECTED",
    "OrbitKVLinker",
    "PoolGeometry",
    "UnsupportedProfileError",
    "build_tree_cache",
    "caller_extra_key",
    "check_profile",
    "describe_pool",
    "lora_identity",
    "match_prefix_hook",
]


def check_profile(server_args: Any, params: Any, components: Any) -> None:
    """Reject every setting the adapter cannot serve, naming it (before any Manager call)."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.runtime_context import get_disagg, get_memory, get_parallel

    require_release(__name__, PINNED_SGLANG)
    mem = get_memory()
    comps = set(components or ())
    others = sorted(c.name for c in comps - {ComponentType.FULL})
    par = get_parallel()
    checks: list[tuple[bool, str]] = [
        (
            bool(others),
            f"tree components {others} (hybrid SWA/Mamba models) are not supported: only dense full-attention "
            "pages are served",
        ),
        (ComponentType.FULL not in comps, "the cache has no FULL component"),
        (bool(mem.enable_hierarchical_cache), "--enable-hierarchical-cache (HiCache host tier) is not supported"),
        (bool(getattr(mem, "enable_linker_mla_dedup", False)), "--enable-linker-mla-dedup is not supported"),
        *request_feature_checks(params, mem),
        (
            get_disagg().disaggregation_mode not in (None, "null"),
            f"--disaggregation-mode {get_disagg().disaggregation_mode}: P/D with OrbitKV is not qualified",
        ),
        (int(par.tp_size) != 1, f"--tp-size {par.tp_size}: only TP=1 is qualified"),
        (int(params.pp_size) != 1, f"pipeline parallelism (pp_size={params.pp_size}) is not qualified"),
        (int(getattr(params, "attn_cp_size", 1) or 1) != 1, "attention context parallelism is not qualified"),
    ]
    refuse_first("linker", checks)


class OrbitKVLinker(LinkerCore, UnifiedCacheLinker):
    """`UnifiedCacheLinker` (0.5.23) over an OrbitKV Manager, constructed by SGLang's
    dynamic linker backend in each scheduler process."""

    # Read by `match_prefix_hook` (no import of this module there).
    orbitkv_rejects_caller_extra_key = True

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: Any = None,
        extra_config: dict[str, Any] | None = None,
        forward_stream: Any = None,
    ) -> None:
        from sglang.srt.runtime_context import get_parallel

        check_profile(server_args, params, components)
        from orbitkv.sglang.plugin import hooks_applied

        if not hooks_applied():
            raise UnsupportedProfileError(
                "OrbitKV SGLang linker: the `orbitkv` sglang.srt.plugins entry point did not run in this process "
                "(is SGLANG_PLUGINS set without orbitkv?): without its match_prefix hook a caller extra_key "
                "could not be rejected, without its checkpoint hook no retention hint would be sent"
            )
        settings = parse_settings(extra_config) if extra_config else parse_settings()
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        geometry = describe_pool(kvcache, int(params.page_size))
        par = get_parallel()
        fp = namespace_for(PINNED_SGLANG, server_args, settings, geometry, (par.tp_rank, par.tp_size), params)
        self._setup(settings, fp, geometry, int(params.page_size), kvcache, forward_stream)
        logger.info(
            "orbitkv: linker on a %s pool (%d pages of %d bytes per block), namespace %s",
            geometry.kind,
            geometry.num_pages,
            geometry.block_bytes,
            fp.hex()[:16],
        )

    def _setup(
        self,
        settings: SGLangSettings,
        fingerprint: bytes,
        geometry: PoolGeometry,
        page_size: int,
        kvcache: Any,
        forward_stream: Any,
    ) -> None:
        LinkerCore.__init__(self, settings, fingerprint, geometry)
        self.page_size = page_size
        self.pools = {PoolName.KV: kvcache}
        self.forward_stream = forward_stream
        self.stats["cancelled_loads"] = 0

    @classmethod
    def for_pool(cls, settings: SGLangSettings, fingerprint: bytes, kvcache: Any, page_size: int) -> OrbitKVLinker:
        """A linker over `kvcache` outside SGLang's construction path (the copy oracle)."""
        linker = cls.__new__(cls)
        linker._setup(settings, fingerprint, describe_pool(kvcache, page_size), page_size, kvcache, None)
        return linker

    def attach(self, wrapper: Any) -> None:
        """Called by the hook the first time the cache matches: the wrapper's hit
        markers say which lookup leases SGLang may still consume (L1)."""
        self.wrapper = wrapper

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        # Called after the batch's forward. The copies read the staged arena slots (no
        # Manager round trip), so they land; the lookup leases are released here.
        if counter_index < 0:
            return True
        while self._batches and self._batches[0].index != counter_index:
            # An older batch SGLang no longer waits for (reset races): finish it too.
            self._finish_batch(self._batches.popleft())
        if not self._batches:
            return True
        self._finish_batch(self._batches.popleft())
        return True

    def num_completed_offloads(self) -> int:
        # Called once per scheduler step (check_hicache_events), never inside a match.
        self._sweep_unselected()
        return super().num_completed_offloads()

    def cancel_queued_load(self, rid: str) -> bool:
        # 0.5.23: a queued load targets slots private to the aborted request, which
        # SGLang frees; a load that has not started is dropped for real.
        self._release_query(rid)
        for ld in list(self._queued):
            if ld.rid == rid:
                self._queued.remove(ld)
                self._release(ld.query)
                self.stats["cancelled_loads"] += 1
                return True
        return False

    def offload(self, transfers: list[PoolTransfer], session_id: str | None = None) -> bool:
        return self._offload(transfers)


def match_prefix_hook(original: Any, cache: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on `UnifiedRadixCache.match_prefix` (0.5.23), registered by the plugin.

    Only on a cache whose linker is the OrbitKV linker: a request with a caller
    `extra_key` is rejected (see `_shared.screen_match`) and matched without
    the linker (`req=None`); every other call is the release's."""
    wrapper = getattr(cache, "linker", None)
    linker = getattr(wrapper, "cache_linker", None)
    if linker is None or not getattr(linker, "orbitkv_rejects_caller_extra_key", False):
        return original(cache, params, *args, **kwargs)
    if linker.wrapper is None:
        linker.attach(wrapper)
    return original(cache, screen_match(linker, params), *args, **kwargs)


def checkpoint_hook(original: Any, cache: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on `UnifiedRadixCache.checkpoint` (0.5.23), registered by the plugin,
    only on a cache whose linker is the OrbitKV linker: after the final checkpoint of a
    finished request (the release's `release_kv_cache`; a running request's chunk
    checkpoints send nothing), its retention hint for the page chain the tree holds for
    it, ending on the node the insert moved the request's lock to (`req.last_node`)."""
    linker = cache.linker.cache_linker
    hint = request_hint(linker, req) if req.finished() else None
    out = original(cache, req, *args, **kwargs)
    if hint is not None:
        send_hint(linker, cache, req, hint, getattr(req, "last_node", None))
    return out


def build_tree_cache(ctx: Any) -> Any:
    """`--radix-cache-backend orbitkv` on 0.5.23: not the selection path there."""
    raise UnsupportedProfileError(
        "--radix-cache-backend orbitkv is the sglang 0.5.21 selection; sglang 0.5.23 refuses a radix-cache "
        f"backend with the external linker. Select OrbitKV with {LINKER_CONFIG_HINT}"
    )
