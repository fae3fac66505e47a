"""Drive the released SGLang tree cache (0.5.21 or 0.5.23) the way its scheduler does, on CPU tensors.

0.5.23 differences the harness follows (its scheduler and `sglang.test.mem_cache_utils`):
the cache is selected through the dynamic linker backend; a match sets `req.prefix_len`;
`init_load_back` returns `(loaded, node)` with the loaded tail in request-private slots
(`cache.prefix_device_indices(req)`); the tree lock is `cache.lock/unlock`; after the
forward `finish_external_linker_loads` confirms the loads; `checkpoint` inserts.


`Engine` builds real pools (`MHATokenToKVPool` / `MLATokenToKVPool`,
`PagedTokenToKVPoolAllocator`, `ReqToTokenPool`), selects the cache through the public
registry (`create_tree_cache` with `--radix-cache-backend orbitkv`, registered by the
plugin entry point), and serves requests through the scheduler's calls in its order:
`Req.init_next_round_input` (match, incl. the linker lookup), `init_load_back`, the tree
lock, `ready_to_load_host_cache` + the worker's consumer index, the "forward" (KV of the
computed positions written, every position read back through the pool's per-layer
accessors, which wait on the linker's layer counter), `insert_req` + frees + unpin
(`sglang.test.mem_cache_utils.finish_req`), and `check_hicache_events` each step.

The KV "model" is a deterministic function of (adapter, token prefix, layer, K/V): a
position's bytes depend on every token up to it, like real KV, so restored bytes can be
checked bit for bit against what the request would have computed.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome, InitLoadBackParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.runtime_context import get_parallel
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.test.mem_cache_utils import finish_req
from sglang_env import V0_5_23
from sglang_pools import cpu_pool, pool_buffers

PAGE = 4
LAYERS = 3


def rank_override() -> Any:
    """The rank names the scheduler process publishes (TP = 1)."""
    if V0_5_23:
        return get_parallel().override(attn_tp_rank=0, attn_tp_size=1, tp_rank=0, tp_size=1)
    return get_parallel().override(attn_tp_rank=0, attn_tp_size=1)


@dataclass
class Served:
    rid: str
    device_hit: int  # tokens matched in SGLang's own tree (HBM)
    external_hit: int  # tokens restored from OrbitKV
    computed: int
    mismatched_bytes: int  # restored/matched bytes that differ from what the request computes
    req: Any = field(repr=False, default=None)
    finished_reason: Any = None  # set when the request was failed (Req.to_finish) during the step


def _tokens_bytes(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype="<u4").tobytes()


class Engine:
    """One SGLang scheduler's cache, pools and worker stand-in (TP=1, CPU)."""

    def __init__(
        self,
        socket_path: str | None,
        *,
        kind: str = "mha",
        pages: int = 64,
        server_args: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
        adapter_tag: str = "",
        build: bool = True,
        kv_cache_events: bool = False,
    ) -> None:
        from orbitkv.sglang import plugin

        plugin.register()  # what the `sglang.srt.plugins` entry point does in every process
        doc = dict(settings or {})
        if socket_path is not None:
            doc.setdefault("orbitkv.socket_path", socket_path)
        doc.setdefault("orbitkv.timeout_ms", 2000)
        os.environ["ORBITKV_SGLANG_CONFIG"] = json.dumps(doc)
        if V0_5_23:
            from sglang.srt.plugins.hook_registry import HookRegistry

            HookRegistry.apply_hooks()  # what load_plugins() does after running the entry points
            kwargs = {
                "model_path": "dummy",
                "page_size": PAGE,
                "enable_unified_cache_external_linker": True,
                "unified_cache_external_linker_backend": "dynamic",
                "unified_cache_external_linker_config": {
                    "linker": "OrbitKVLinker",
                    "linker_module_path": "orbitkv.sglang.v0_5_23",
                    "linker_extra_config": doc,
                },
            }
        else:
            kwargs = {
                "model_path": "dummy",
                "page_size": PAGE,
                "enable_unified_cache_external_linker": True,
                "radix_cache_backend": "orbitkv",
            }
        kwargs.update(server_args or {})
        self.args = ServerArgs(**kwargs)
        # The LoRA part of the launcher's validation (`check_server_args`): it resolves
        # the effective enablement and the startup adapter references.
        from sglang.srt.arg_groups.lora_hook import check_lora_server_args

        check_lora_server_args(self.args)
        set_global_server_args_for_scheduler(self.args)
        from sglang.srt.runtime_context import get_lora

        self.lora_refs = list(get_lora().lora_paths or [])  # resolved LoRARef records
        self.kind = kind
        size = pages * PAGE
        self.kv = cpu_pool(kind, pages=pages, page=PAGE, layers=LAYERS)
        self.buffers = pool_buffers(self.kv, kind)
        for b in self.buffers:  # garbage, not zeros: an unloaded page must not look right
            b.view(torch.uint8).copy_(torch.randint(0, 256, b.view(torch.uint8).shape, dtype=torch.uint8))
        self.alloc = PagedTokenToKVPoolAllocator(
            size=size, page_size=PAGE, dtype=torch.bfloat16, device="cpu", kvcache=self.kv, need_sort=False
        )
        self.req_pool = ReqToTokenPool(size=16, max_context_len=size, device="cpu", enable_memory_saver=False)
        self.params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.alloc,
            page_size=PAGE,
            enable_kv_cache_events=kv_cache_events,  # SGLang's own KV events (`cache.take_events()`)
        )
        self.registered: list[Any] = []
        self.worker = SimpleNamespace(
            register_hicache_layer_transfer_counter=self.registered.append,
            model_runner=SimpleNamespace(forward_stream=None),
        )
        self.adapter_tag = adapter_tag
        self._n = 0
        if build:
            with rank_override():
                self.cache = create_tree_cache(self.context())

    def context(self) -> TreeCacheBuildContext:
        extra = {} if V0_5_23 else {"effective_chunked_prefill_size": None}
        return TreeCacheBuildContext(
            server_args=self.args,
            params=self.params,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hierarchical_cache=False,
            disable_radix_cache=False,
            tp_worker=self.worker,
            model_config=SimpleNamespace(),
            tp_size=1,
            tp_rank=0,
            tp_group=None,
            **extra,
        )

    @property
    def linker(self) -> Any:
        return self.cache.linker.cache_linker

    # -- the "model" ------------------------------------------------------------------------

    def expected(self, tokens: list[int], pos: int, buf: int, lora: str | None) -> torch.Tensor:
        b = self.buffers[buf]
        row_bytes = b[0].numel() * b.element_size()
        seed = hashlib.sha256(f"{self.adapter_tag}|{lora}|{buf}|".encode() + _tokens_bytes(tokens[: pos + 1])).digest()
        rng = np.random.default_rng(int.from_bytes(seed[:8], "little"))
        return torch.from_numpy(rng.integers(0, 256, row_bytes, dtype=np.uint8))

    def _rows(self, buf: int) -> torch.Tensor:
        b = self.buffers[buf]
        return b.view(torch.uint8).reshape(b.shape[0], -1)

    def _read_buffer(self, buf: int) -> torch.Tensor:
        """Through the pool's accessor: waits on the linker's layer counter first."""
        layer = buf // 2 if self.kind == "mha" else buf
        if self.kind == "mha":
            t = self.kv.get_key_buffer(layer) if buf % 2 == 0 else self.kv.get_value_buffer(layer)
        else:
            t = self.kv.get_key_buffer(layer)
        return t.view(torch.uint8).reshape(t.shape[0], -1)

    # -- one request, the scheduler's calls in order ---------------------------------------

    def admit(
        self,
        tokens: list[int],
        *,
        rid: str | None = None,
        lora_id: str | None = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        custom_params: dict[str, Any] | None = None,
    ) -> Any:
        """Waiting-queue match, then admission: init_load_back and the tree lock."""
        self._n += 1
        req = Req(
            rid or f"r{self._n}",
            "",
            array("q", tokens),
            SamplingParams(max_new_tokens=1, custom_params=custom_params),
            lora_id=lora_id,
            extra_key=extra_key,
            cache_salt=cache_salt,
        )
        req.init_next_round_input(self.cache)
        if V0_5_23:
            return self._admit_0_5_23(req)
        req.orbit_device_hit = len(req.prefix_indices)
        req.orbit_loaded = 0
        if req.needs_host_load_back():
            loaded = self.cache.init_load_back(
                InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
            )
            assert loaded is not None
            new_indices, req.last_node = loaded
            req.orbit_loaded = len(new_indices)
            req.prefix_indices = torch.cat([req.prefix_indices.to(torch.int64), new_indices.to(torch.int64)])
        req.kv.cache_protected_len = len(req.prefix_indices)
        req.lock_receipt = self.cache.inc_lock_ref(req.last_node).to_dec_params()
        return req

    def _admit_0_5_23(self, req: Any) -> Any:
        req.orbit_device_hit = req.prefix_len
        req.orbit_loaded = 0
        if req.needs_host_load_back():
            loaded = self.cache.init_load_back(
                InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
            )
            assert loaded is not None
            req.host_loaded_length, req.last_node = loaded
            req.orbit_loaded = req.host_loaded_length
            req.prefix_len += req.host_loaded_length
        req.orbit_protected = req.orbit_device_hit  # the tree part; a loaded tail is request-owned
        req.lock = self.cache.lock(req.last_node)
        return req

    def unlock(self, req: Any) -> None:
        """The scheduler drops an admitted request's tree lock."""
        if V0_5_23:
            self.cache.unlock(req.lock)
            req.lock = None
        else:
            self.cache.dec_lock_ref(req.last_node, req.lock_receipt)

    def abort_waiting(self, tokens: list[int], *, rematch: int = 0, **kw: Any) -> Any:
        """A request matched in the waiting queue (again in `rematch` later scheduling
        rounds), then aborted there (never admitted)."""
        self._n += 1
        req = Req(f"r{self._n}", "", array("q", tokens), SamplingParams(max_new_tokens=1), **kw)
        for _ in range(1 + rematch):
            req.init_next_round_input(self.cache)
        self.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
        return req

    def run(self, req: Any, tokens: list[int], *, lora_id: str | None = None) -> Served:
        """Start the batch's loads, "forward" the rest, check every position, finish."""
        consumer = self.cache.ready_to_load_host_cache()
        for counter in self.registered:
            counter.set_consumer(consumer)
        n = len(tokens)
        prefix = self.cache.prefix_device_indices(req) if V0_5_23 else req.prefix_indices
        pre = len(prefix)
        rest = n - pre
        alloc_len = -(-rest // PAGE) * PAGE
        new = self.alloc.alloc(alloc_len) if alloc_len else torch.empty(0, dtype=torch.int64)
        assert new is not None, "pool exhausted"
        self.req_pool.alloc([req])
        if V0_5_23:
            req.kv.cache_protected_len = req.orbit_protected
        slots = torch.cat([prefix.to(torch.int64), new[:rest].to(torch.int64)])
        self.req_pool.req_to_token[req.kv.req_pool_idx, :n] = slots.to(self.req_pool.req_to_token.dtype)
        req.kv.kv_allocated_len = pre + alloc_len
        req.kv.kv_committed_len = n
        for buf in range(len(self.buffers)):
            rows = self._rows(buf)
            for pos in range(pre, n):
                rows[int(slots[pos])] = self.expected(tokens, pos, buf, lora_id)
        mismatched = 0
        for buf in range(len(self.buffers)):
            rows = self._read_buffer(buf)
            for pos in range(n):
                got = rows[int(slots[pos])]
                mismatched += int((got != self.expected(tokens, pos, buf, lora_id)).sum())
        for counter in self.registered:
            counter.set_consumer(-1)
        if V0_5_23:
            # After the forward: the scheduler confirms the batch's loads.
            failed = self.cache.finish_external_linker_loads([req])
            assert not failed, "an OrbitKV load did not land"
        if req.to_finish is not None:
            # process_batch_result: a request failed during the step finishes with its reason.
            req.update_finish_state()
        reason = req.finished_reason  # before finish_req (0.5.23's marks a plain finish FINISH_LENGTH)
        if req.skip_radix_cache_insert:  # release_kv_cache(is_insert=False)
            self.cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, n)])
            if V0_5_23:
                self.cache.unlock(req.lock)
                req.lock = None
            else:
                self.cache.unpin(req)
        else:
            finish_req(self.cache, req, n)
        self.req_pool.free(req)
        self.step()
        return Served(req.rid, req.orbit_device_hit, req.orbit_loaded, rest, mismatched, req, reason)

    def serve(self, tokens: list[int], **kw: Any) -> Served:
        lora_id = kw.get("lora_id")
        return self.run(self.admit(tokens, **kw), tokens, lora_id=lora_id)

    def step(self) -> None:
        """The scheduler's per-step event poll (load and offload completions)."""
        self.cache.check_hicache_events()

    def drained(self) -> dict[str, int]:
        return self.linker.outstanding

    def close(self) -> None:
        if hasattr(self, "cache"):
            self.step()
            self.cache.release_host_resources()


def prompt(seed: int, pages: int) -> list[int]:
    """`pages` whole pages plus one token (SGLang always computes the last token)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(1, 30000, pages * PAGE + 1)]
