"""Release-independent parts of the OrbitKV SGLang linkers (0.5.21 and 0.5.23).

The per-release modules (`v0_5_21.py`, `v0_5_23.py`) subclass `LinkerCore` together with
their release's `UnifiedCacheLinker` ABC and add what differs between releases (load
completion, cancellation, the offload signature, construction and selection). Nothing
here branches on the SGLang version. The SGLang symbols used here have the same module
paths and shapes in both releases (checked against the installed packages).

**Why lookups stage.** Everything that can fail in a load (the Manager lookup and the
staging of the hit into the shared arena, under a lease) happens in `lookup`; a queued
load is then only a copy from the mapped arena into the pages, which no Manager failure
can stop (the mapping outlives a dead Manager). In 0.5.21 a load's pages join the tree
before it runs; in 0.5.23 a load that does not land aborts its request with HTTP 503.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

from orbitkv.engine.hints import RetentionHint
from orbitkv.engine.identity import adapter_digest, model_config_digest
from orbitkv.engine.session import ReconnectBackoff, connection_lost
from orbitkv.hashing import fingerprint as namespace_fingerprint
from orbitkv.kvcopy.layout import LayerPages, backing_bytes
from orbitkv.sglang.config import OrbitKVSGLangConfigError, SGLangSettings
from orbitkv.sglang.session import Reconnect, Session

logger = logging.getLogger("orbitkv.sglang")

SCHEMA = "orbitkv.sglang.namespace/1"
# SGLang's storage keys: per-page SHA-256 chain over little-endian uint32 token ids,
# seeded by sha256("sglang-cache-namespace-v1" + framed extra_key + framed cache_salt).
KEY_SCHEME = "sglang-storage-sha256/namespace-seed-v1"


class UnsupportedProfileError(OrbitKVSGLangConfigError):
    """The SGLang configuration uses something this adapter cannot serve correctly."""


def require_release(module: str, pinned: str) -> None:
    """Refuse any installed SGLang but the release `module` is written for."""
    installed = version("sglang")
    if installed != pinned:
        raise UnsupportedProfileError(f"{module} needs sglang=={pinned}, found {installed}")


def request_feature_checks(params: Any, mem: Any) -> list[tuple[bool, str]]:
    """The profile checks both releases make on the same settings (each release's
    `check_profile` adds its own before and after them)."""
    from sglang.srt.runtime_context import get_serving

    return [
        (
            hasattr(params.req_to_token_pool, "req_to_c128_sidecar"),
            "C128 sidecar (NPU DeepSeek-V4) components are not supported",
        ),
        (bool(params.is_eagle), "EAGLE speculative decoding (bigram keys) is not qualified"),
        (bool(mem.enable_session_radix_cache), "--enable-session-radix-cache (radix sessions) is rejected"),
        (bool(get_serving().enable_streaming_session), "--enable-streaming-session (resumable sessions) is rejected"),
    ]


def refuse_first(subject: str, checks: list[tuple[bool, str]]) -> None:
    """Raise `UnsupportedProfileError` for the first failed (bad, why) check, naming its setting."""
    for bad, why in checks:
        if bad:
            raise UnsupportedProfileError(f"OrbitKV SGLang {subject}: {why}")


# ---------------------------------------------------------------------------------------
# Device pool geometry
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolGeometry:
    kind: str  # "mha" | "mla"
    layers: list[LayerPages]  # in cached-block order
    num_pages: int
    block_bytes: int
    identity: dict[str, Any]


def _page_pages(t: torch.Tensor, page_size: int, name: str) -> LayerPages:
    """One layer buffer `[rows, heads, dim]` (slot-major rows) as pages of `page_size` rows."""
    if t.dim() != 3:
        raise UnsupportedProfileError(
            f"{name}: expected a [slots, heads, dim] KV buffer, got shape {tuple(t.shape)} "
            "(HND (SGLANG_USE_HND_KVCACHE) and vectorized KV layouts are not supported)"
        )
    if not t.is_contiguous():
        raise UnsupportedProfileError(f"{name}: the KV buffer is not contiguous")
    rows = int(t.shape[0])
    if rows % page_size:
        raise UnsupportedProfileError(f"{name}: {rows} slots are not whole pages of {page_size}")
    row_bytes = int(t.stride(0)) * t.element_size()
    page_bytes = page_size * row_bytes
    backing = backing_bytes(t)
    base = int(t.storage_offset()) * t.element_size()
    return LayerPages(backing, base, page_bytes, (page_bytes,), (1,), page_bytes, rows // page_size)


def describe_pool(kvcache: Any, page_size: int) -> PoolGeometry:
    """The cached-block geometry of the released dense MHA or MLA device pool.

    Exactly `MHATokenToKVPool` and `MLATokenToKVPool` are accepted: their subclasses
    (quantized FP4/MXFP8, no-op, page-major, ...) and every hybrid pool are rejected,
    naming the class."""
    cls = type(kvcache)
    if cls is MHATokenToKVPool:
        if getattr(kvcache, "is_quantized_kv_cache", False):
            raise UnsupportedProfileError("quantized KV cache (scale buffers) is not supported by OrbitKV")
        k, v = list(kvcache.k_buffer), list(kvcache.v_buffer)
        if len(k) != len(v) or not k:
            raise UnsupportedProfileError(f"MHA pool with {len(k)} K and {len(v)} V layer buffers")
        layers: list[LayerPages] = []
        for i, (kt, vt) in enumerate(zip(k, v, strict=True)):
            layers.append(_page_pages(kt, page_size, f"k_buffer[{i}]"))
            layers.append(_page_pages(vt, page_size, f"v_buffer[{i}]"))
        identity = {
            "kind": "mha",
            "layers": len(k),
            "heads": int(k[0].shape[1]),
            "k_dim": int(k[0].shape[2]),
            "v_dim": int(v[0].shape[2]),
        }
        kind = "mha"
    elif cls is MLATokenToKVPool:
        bufs = list(kvcache.kv_buffer)
        if not bufs:
            raise UnsupportedProfileError("MLA pool without layer buffers")
        layers = [_page_pages(t, page_size, f"kv_buffer[{i}]") for i, t in enumerate(bufs)]
        identity = {"kind": "mla", "layers": len(bufs), "kv_cache_dim": int(bufs[0].shape[2])}
        kind = "mla"
    else:
        raise UnsupportedProfileError(
            f"KV pool {cls.__module__}.{cls.__qualname__} is not supported: OrbitKV serves dense "
            "MHATokenToKVPool and MLATokenToKVPool only (hybrid SWA/Mamba/DSA/quantized pools are rejected)"
        )
    devices = {p.backing.device for p in layers}
    if len(devices) != 1:
        raise UnsupportedProfileError(f"KV layer buffers live on several devices: {sorted(map(str, devices))}")
    num_pages = min(p.blocks for p in layers)
    identity.update(
        {
            "dtype": str(getattr(kvcache, "dtype", None)),
            "store_dtype": str(getattr(kvcache, "store_dtype", None)),
            "start_layer": int(getattr(kvcache, "start_layer", 0) or 0),
            "page_size": page_size,
            "page_bytes": [p.page_bytes for p in layers],
        }
    )
    return PoolGeometry(kind, layers, num_pages, sum(p.page_bytes for p in layers), identity)


# ---------------------------------------------------------------------------------------
# Identity (K1, K4)
# ---------------------------------------------------------------------------------------


def lora_identity(lora: Any) -> dict[str, Any] | None:
    """The static LoRA identity from SGLang's resolved runtime configuration.

    `enable_lora` in the resolved bag is the *effective* enablement (`--lora-paths` turns
    it on). Each startup adapter's files are hashed (local PEFT directories only); the
    backend and target modules are bound. Runtime-loaded adapters get random ids from
    SGLang and are not part of the identity ("stop, change artifacts, restart")."""
    enabled = bool(getattr(lora, "enable_lora", False))
    refs = list(getattr(lora, "lora_paths", None) or [])
    if not enabled and not refs:
        return None
    adapters: dict[str, Any] = {}
    for ref in refs:
        name = getattr(ref, "lora_name", None)
        path = getattr(ref, "lora_path", None)
        if not isinstance(name, str) or not isinstance(path, str):
            raise UnsupportedProfileError(f"LoRA adapter reference {ref!r} has no name or path")
        try:
            adapters[name] = {"files": adapter_digest(path), "lora_id": getattr(ref, "lora_id", None)}
        except (OSError, ValueError) as exc:
            raise UnsupportedProfileError(
                f"--lora-paths {name}={path}: only local PEFT adapter directories can be fingerprinted ({exc})"
            ) from None
    modules = getattr(lora, "lora_target_modules", None)
    return {
        "enable_lora": enabled,
        "backend": getattr(lora, "lora_backend", None),
        "target_modules": sorted(modules) if modules else None,
        "max_lora_rank": getattr(lora, "max_lora_rank", None),
        "adapters": dict(sorted(adapters.items())),
    }


def _model_identity(server_args: Any, settings: SGLangSettings) -> Any:
    if settings.model_identity is not None:
        return settings.model_identity
    path = getattr(server_args, "model_path", None)
    return {
        "path": path,
        "revision": getattr(server_args, "revision", None),
        "config_sha256": model_config_digest(path) if isinstance(path, str) else None,
        "quantization": getattr(server_args, "quantization", None),
        "kv_cache_dtype": getattr(server_args, "kv_cache_dtype", None),
    }


def namespace_for(
    pinned: str,
    server_args: Any,
    settings: SGLangSettings,
    geometry: PoolGeometry,
    tp: tuple[int, int],
    params: Any,
) -> bytes:
    """The namespace fingerprint of one scheduler process (K1): the engine pin (`pinned`,
    the SGLang release), the model, the pool geometry, the key scheme, its TP and PP
    position (PP from the cache `params`), the attention backend and the LoRA identity
    (from SGLang's resolved runtime configuration)."""
    from sglang.srt.runtime_context import get_lora

    pp = (params.pp_rank, params.pp_size)
    return namespace_fingerprint(
        {
            "schema": SCHEMA,
            "engine": f"sglang=={pinned}",
            "model": _model_identity(server_args, settings),
            "kv": geometry.identity,
            "keys": KEY_SCHEME,
            "tp": [int(tp[0]), int(tp[1])],
            "pp": [int(pp[0]), int(pp[1])],
            "attention_backend": getattr(server_args, "attention_backend", None),
            "lora": lora_identity(get_lora()),
        }
    )


# ---------------------------------------------------------------------------------------
# The linker
# ---------------------------------------------------------------------------------------


@dataclass
class _Query:
    """A lookup hit of one request: its lease pins and stages `hit` blocks in the arena."""

    keys: list[str]
    index: dict[str, int]
    lease: Any
    slots: np.ndarray  # [hit, 2] int64 (segment, offset)
    session: Session


@dataclass
class _Load:
    rid: str
    query: _Query
    slots: np.ndarray
    pages: list[int]


@dataclass
class _Batch:
    index: int
    loads: list[_Load]
    handles: list[Any] = field(default_factory=list)


@dataclass
class _Offload:
    pending: Any
    handle: Any  # SaveHandle, or None when nothing had to be copied
    session: Session
    blocks: int


class _LayerCounter:
    """The `layer_done_counter` SGLang's KV pool waits on before reading a layer."""

    def __init__(self, linker: LinkerCore) -> None:
        self._linker = linker
        self.consumer_index = -1

    def set_consumer(self, index: int) -> None:
        self.consumer_index = index

    def update_producer(self) -> int:
        return self._linker._batch_index

    def wait_until(self, layer: int) -> None:
        if self.consumer_index < 0:
            return
        self._linker._wait_batch(self.consumer_index, layer)

    def reset(self) -> None:
        self.consumer_index = -1


class LinkerCore:
    """The release-independent part of the OrbitKV linker. Driven from the scheduler thread."""

    def __init__(self, settings: SGLangSettings, fingerprint: bytes, geometry: PoolGeometry) -> None:
        self.settings = settings
        self.fingerprint = fingerprint
        self.geometry = geometry
        self.page_size = 0  # set by build_tree_cache
        self.layer_done_counter = _LayerCounter(self)
        self._session: Session | None = None
        self._old_sessions: list[Session] = []
        self._backoff = ReconnectBackoff(logger)
        self._attempted = False  # the first connection attempt (made inline) was made
        self._reconnect: Reconnect | None = None  # a later attempt, in the background
        self._queries: dict[str, _Query] = {}
        self._queued: list[_Load] = []
        self._batches: deque[_Batch] = deque()
        self._batch_index = -1
        self._offloads: deque[_Offload] = deque()
        self.suppress_offload = False  # set by the cache while inserting a rejected (caller extra_key) request
        # The released wrapper driving this linker (set by build_tree_cache): its hit
        # markers say which lookup leases SGLang may still consume.
        self.wrapper: Any = None
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "lookups",
                "lookup_hit_blocks",
                "lookup_errors",
                "loads",
                "loaded_blocks",
                "cancel_refused",
                "query_leases_released",
                "offloads",
                "offloaded_blocks",
                "offload_failures",
                "offloads_suppressed",
                "extra_key_rejected",
                "hints_sent",
                "hint_blocks",
                "hints_rejected",
                "hint_errors",
            ),
            0,
        )

    # -- sessions --------------------------------------------------------------------

    def _connect(self) -> Session | None:
        s = self._session
        if s is not None and s.broken:
            # Keep the broken session alive while anything refers to its arena mapping.
            self._session = None
            self._old_sessions.append(s)
            s = None
        self._reap_sessions()
        if s is not None:
            return s
        client: Any = None
        if self._reconnect is not None:
            if not self._reconnect.done():
                return None
            client, self._reconnect = self._reconnect.result, None
            if isinstance(client, BaseException):
                self._backoff.failed(client)
                return None
        elif self._backoff.wait_left() > 0:
            return None
        elif self._attempted:
            # Only the first connection is made on the scheduler thread; later ones (after
            # a lost connection or a failed attempt) in the background, so a Manager that
            # accepts and never answers costs no step `timeout_ms` per back-off period.
            self._reconnect = Reconnect(self.settings)
            return None
        self._attempted = True
        try:
            s = Session(self.settings, self.fingerprint, self.geometry, client)
        except Exception as exc:
            self._backoff.failed(exc)
            return None
        self._backoff.succeeded()
        self._session = s
        return s

    def _reap_sessions(self) -> None:
        keep = []
        for s in self._old_sessions:
            if s.users == 0:
                s.close()
            else:
                keep.append(s)
        self._old_sessions = keep

    def _failed(self, s: Session, what: str, exc: BaseException) -> None:
        if connection_lost(exc):
            s.broken = True
        logger.warning("orbitkv: %s failed (%s); the request recomputes", what, exc)

    def _release(self, q: _Query) -> None:
        q.session.users -= 1
        if q.session.broken:
            return  # the Manager dropped the session's leases with the connection
        try:
            q.session.client.release(q.lease, wait=False)  # no round trip on the scheduler thread
        except Exception as exc:
            self._failed(q.session, "releasing a lease", exc)

    def _release_query(self, rid: str) -> None:
        """Release the staged hit (lookup lease) of `rid` that no load consumed, if any."""
        q = self._queries.pop(rid, None)
        if q is not None:
            self._release(q)
            self.stats["query_leases_released"] += 1

    # -- lookup (match) ----------------------------------------------------------------

    def _kv_keys(self, transfers: list[PoolTransfer]) -> list[str] | None:
        if len(transfers) != 1 or transfers[0].name != PoolName.KV:
            return None
        return list(transfers[0].keys or [])

    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        keys = self._kv_keys(transfers)
        old = self._queries.get(rid)
        if old is not None and not old.session.broken and keys is not None and keys[: len(old.keys)] == old.keys:
            # A waiting request matched again with the same uncached tail (every
            # scheduling round): keep its staged hit instead of a new Manager round trip.
            return list(range(1, len(old.keys) + 1))
        if old is not None:  # a re-match with another tail replaces its previous hit
            self._release_query(rid)
        if not keys:
            return []
        s = self._connect()
        if s is None:
            return []
        self.stats["lookups"] += 1
        try:
            hashes = [bytes.fromhex(k) for k in keys]
        except ValueError:
            return []
        try:
            lease = s.client.lookup(s.ns, hashes)
        except Exception as exc:
            self.stats["lookup_errors"] += 1
            self._failed(s, "lookup", exc)
            return []
        hit = int(lease.hit_blocks)
        if hit == 0:
            try:
                s.client.release(lease)
            except Exception as exc:
                self._failed(s, "releasing an empty lease", exc)
            return []
        try:
            # Stage the hit now: the one step of a load that can fail (tier error, dead
            # Manager) happens before SGLang commits the pages to its tree.
            from orbitkv.kvcopy import slots_array

            slots = slots_array(s.client.acquire_packed(lease)).copy()
        except Exception as exc:
            self.stats["lookup_errors"] += 1
            self._failed(s, "staging a hit", exc)
            if not s.broken:
                try:
                    s.client.release(lease)
                except Exception:
                    logger.debug("orbitkv: releasing a failed lease", exc_info=True)
            return []
        s.users += 1
        self._queries[rid] = _Query(keys[:hit], {k: i for i, k in enumerate(keys[:hit])}, lease, slots, s)
        self.stats["lookup_hit_blocks"] += hit
        return list(range(1, hit + 1))

    # -- load ---------------------------------------------------------------------------

    def _page_ids(self, indices: torch.Tensor, n_keys: int) -> list[int]:
        page = self.page_size
        idx = indices.to(device="cpu", dtype=torch.int64).reshape(-1)
        if idx.numel() != n_keys * page:
            raise ValueError(f"{idx.numel()} device slots for {n_keys} pages of {page} tokens")
        rows = idx.reshape(n_keys, page)
        first = rows[:, 0]
        expected = first.unsqueeze(1) + torch.arange(page, dtype=torch.int64)
        if bool((first % page != 0).any()) or not torch.equal(rows, expected):
            raise ValueError("device slots are not whole, page-aligned pages")
        ids = (first // page).tolist()
        if any(not 0 <= b < self.geometry.num_pages for b in ids):
            raise ValueError(f"page id outside the pool's {self.geometry.num_pages} pages")
        return ids

    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        q = self._queries.pop(rid, None)
        keys = self._kv_keys(transfers)
        if q is None or keys is None:
            # No staged hit for this request: SGLang raises on False (the load would
            # otherwise leave unloaded pages in its tree).
            logger.error("orbitkv: load for %r without a staged lookup hit", rid)
            if q is not None:
                self._release(q)
            return False
        try:
            rows = [q.index[k] for k in keys]
        except KeyError:
            logger.error("orbitkv: load for %r asks for a page its lookup did not hit", rid)
            self._release(q)
            return False
        pages = self._page_ids(transfers[0].device_indices, len(keys))
        self._queued.append(_Load(rid, q, q.slots[rows], pages))
        self.stats["loads"] += 1
        self.stats["loaded_blocks"] += len(rows)
        return True

    def start_layer_wise_loading(self) -> int:
        if not self._queued:
            return -1
        self._batch_index = (self._batch_index + 1) % 3
        batch = _Batch(self._batch_index, self._queued)
        self._queued = []
        for ld in batch.loads:
            # Copies from the mapped arena: no Manager round trip, so a Manager that died
            # since the lookup cannot fail it (the lease's slots stay mapped and unchanged).
            batch.handles.append(ld.query.session.engine.load(ld.slots, ld.pages))
        self._batches.append(batch)
        return batch.index

    def _wait_batch(self, index: int, layer: int) -> None:
        for batch in self._batches:
            if batch.index == index:
                for h, ld in zip(batch.handles, batch.loads, strict=True):
                    engine = ld.query.session.engine
                    h.wait_layer(engine.num_layers - 1)

    def _sweep_unselected(self) -> None:
        """L1: release lookup leases SGLang will not consume. The wrapper drops a hit
        marker without calling the linker when load-back cannot allocate pages (its
        ABORT phase) or when ranks agree on no common prefix."""
        markers = getattr(self.wrapper, "hit_markers", None)
        if markers is None:
            return
        for rid in [r for r in self._queries if r not in markers]:
            self._release_query(rid)

    # -- offload --------------------------------------------------------------------------

    def _offload(self, transfers: list[PoolTransfer]) -> bool:
        if self.suppress_offload:
            self.stats["offloads_suppressed"] += 1
            return False
        if len(transfers) != 1 or transfers[0].name != PoolName.KV or not transfers[0].keys:
            return False
        s = self._connect()
        if s is None:
            return False
        t = transfers[0]
        keys = list(t.keys)
        pages = self._page_ids(t.device_indices, len(keys))
        try:
            pending = s.client.begin_save(s.ns, [bytes.fromhex(k) for k in keys])
        except Exception as exc:
            self.stats["offload_failures"] += 1
            self._failed(s, "beginning a save", exc)
            return False
        from orbitkv.kvcopy import slots_array

        statuses = pending.statuses
        rows = [i for i, st in enumerate(statuses) if st == "allocated"]
        handle = None
        try:
            if rows:
                slots = slots_array(pending.packed_slots)[rows]
                handle = s.engine.save([pages[i] for i in rows], slots)
        except Exception as exc:
            self.stats["offload_failures"] += 1
            logger.warning("orbitkv: copying pages for a save failed (%s)", exc)
            try:
                s.client.abort_save(pending)
            except Exception as exc2:
                self._failed(s, "aborting a save", exc2)
            return False
        s.users += 1
        self._offloads.append(_Offload(pending, handle, s, len(rows)))
        return True

    # -- retention hints -------------------------------------------------------------------

    def retain(self, rid: str, keys: list[str], hint: RetentionHint) -> None:
        """Send a finished request's retention hint for its page chain (`keys`, SGLang's
        page hashes); a failure is logged and counted, never raised."""
        s = self._connect()
        if s is None:
            self.stats["hint_errors"] += 1
            return
        try:
            applied, pending, _ = s.client.retain(s.ns, [bytes.fromhex(k) for k in keys], **hint.as_kwargs())
        except Exception as exc:
            self.stats["hint_errors"] += 1
            if connection_lost(exc):
                s.broken = True
            logger.warning("orbitkv: retention hint of request %s failed (%s)", rid, exc)
            return
        self.stats["hints_sent"] += 1
        self.stats["hint_blocks"] += applied + pending

    def num_completed_offloads(self) -> int:
        n = 0
        for off in self._offloads:
            if off.handle is not None and not off.handle.query():
                break
            n += 1
        return n

    def pop_completed_offload(self) -> bool:
        off = self._offloads.popleft()
        off.session.users -= 1
        s = off.session
        try:
            if s.broken:
                raise s.native.ManagerUnavailable("the Manager session broke before the save was committed")
            s.client.commit_save(off.pending)
        except Exception as exc:
            self.stats["offload_failures"] += 1
            self._failed(s, "committing a save", exc)
            if not s.broken:
                try:
                    s.client.abort_save(off.pending)
                except Exception:
                    logger.debug("orbitkv: aborting a failed save", exc_info=True)
            return False
        self.stats["offloads"] += 1
        self.stats["offloaded_blocks"] += off.blocks
        return True

    # -- lifecycle -------------------------------------------------------------------------

    def _finish_batch(self, batch: _Batch) -> None:
        """Wait for a started batch's copies and release its lookup leases."""
        for h in batch.handles:
            h.synchronize()
        for ld in batch.loads:
            self._release(ld.query)

    def _quiesce(self) -> None:
        """Finish every copy, commit finished saves, release every lease (L2, L6)."""
        # Queued loads never started: SGLang resets its tree and frees their pages.
        for ld in self._queued:
            self._release(ld.query)
        self._queued = []
        while self._batches:
            self._finish_batch(self._batches.popleft())
        while self._offloads:
            if self._offloads[0].handle is not None:
                self._offloads[0].handle.synchronize()
            self.pop_completed_offload()
        for q in self._queries.values():
            self._release(q)
        self._queries.clear()
        self.layer_done_counter.reset()

    def reset(self) -> None:
        # flush_cache: SGLang's tree and pages go; the Manager's entries stay (same weights,
        # same namespace generation: L5, "flush_cache keeps same-weight external reuse").
        self._quiesce()

    def close(self) -> None:
        self._quiesce()
        if self._reconnect is not None:
            self._reconnect.abandon()
            self._reconnect = None
        if self._session is not None:
            self._old_sessions.append(self._session)
            self._session = None
        for s in self._old_sessions:
            s.close()
        self._old_sessions = []

    # -- introspection (tests, metrics) -------------------------------------------------------

    @property
    def outstanding(self) -> dict[str, int]:
        return {
            "query_leases": len(self._queries),
            "queued_loads": len(self._queued),
            "load_batches": len(self._batches),
            "offloads": len(self._offloads),
        }


# ---------------------------------------------------------------------------------------
# Caller extra_key (K3)
# ---------------------------------------------------------------------------------------


def caller_extra_key(req: Any) -> bool:
    """True when the request carries an `extra_key` of its caller (not just its LoRA id,
    which SGLang appends to `extra_key`): such keys could alias an adapter (K3)."""
    extra = getattr(req, "extra_key", None)
    lora_id = getattr(req, "lora_id", None)
    if lora_id is None:
        return extra is not None
    return extra != lora_id


EXTRA_KEY_REJECTED = (
    "OrbitKV SGLang adapter: a caller-supplied extra_key is rejected when OrbitKV is the external KV cache "
    "(SGLang concatenates it with the LoRA id, so it could alias another adapter's or tenant's cached KV); "
    "use cache_salt to isolate tenants"
)


def reject_caller_extra_key(req: Any) -> bool:
    """Fail `req` (HTTP 400, naming `extra_key`) the way the release fails a request
    mid-flight (`Req.to_finish = FINISH_ABORT`, "abort method 3"): the request runs its
    prefill without OrbitKV, is finished with the error after that step, and nothing it
    computed is inserted into the tree (`skip_radix_cache_insert`) or offloaded. Raising
    here instead would stop the scheduler (its event loop SIGQUITs the server on any
    exception). Returns True the first time a request is rejected."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.skip_radix_cache_insert = True
    if req.finished() or isinstance(req.to_finish, FINISH_ABORT):
        return False
    req.to_finish = FINISH_ABORT(EXTRA_KEY_REJECTED, HTTPStatus.BAD_REQUEST, "BadRequestError")
    logger.error("%s (rid=%s)", EXTRA_KEY_REJECTED, req.rid)
    return True


def screen_match(linker: LinkerCore, params: Any) -> Any:
    """The match parameters to pass on (K3): a request with a caller `extra_key` is
    rejected (counted once) and matched without the linker (`req=None`); any other
    request's parameters are returned unchanged."""
    req = getattr(params, "req", None)
    if req is None or not caller_extra_key(req):
        return params
    from dataclasses import replace

    if reject_caller_extra_key(req):
        linker.stats["extra_key_rejected"] += 1
    return replace(params, req=None)
