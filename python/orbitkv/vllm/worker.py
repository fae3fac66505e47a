"""Worker-side role of `OrbitKVConnector` (runs in each vLLM worker process).

Loads run on a small thread pool (the native client releases the GIL), so
`start_load_kv` only submits them and the step never waits on a slow tier; their
completions are harvested by `get_transfer_results`, which reports every started load
exactly once in `finished_recving` (and, if it failed, also in `failed_recving`, with
the failed destination blocks in `get_block_ids_with_load_errors` in the same pass).
Saves run in `wait_for_save`, after the step's forward has written the pages; they
finish before it returns, so no source block outlives the step (L4, best effort).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from orbitkv.vllm.config import OrbitKVSettings
from orbitkv.vllm.layout import BlockGeometry, HostCopier, LayoutError, describe
from orbitkv.vllm.metadata import LoadSpec, OrbitKVConnectorMetadata, SaveSpec
from orbitkv.vllm.native import ManagerSession, page_layout
from orbitkv.vllm.worker_meta import OrbitKVWorkerMetadata

if TYPE_CHECKING:
    from orbitkv._native import PageLayout

logger = logging.getLogger("orbitkv.vllm")


@dataclass
class _LoadOutcome:
    req_id: str
    failed_block_ids: list[int] = field(default_factory=list)
    total_failure: bool = False
    bytes_copied: int = 0


class OrbitKVWorker:
    def __init__(self, settings: OrbitKVSettings, session: ManagerSession, num_blocks: int) -> None:
        self.settings = settings
        self.session = session
        self.num_blocks = num_blocks
        self.copier: HostCopier | None = None
        self._kv: np.ndarray | None = None  # the whole KV backing buffer, as bytes
        self._layout: PageLayout | None = None  # native geometry, built on first transfer (O4)
        self._pool: ThreadPoolExecutor | None = None
        self._loads: dict[str, Future[_LoadOutcome]] = {}
        self._load_errors: set[int] = set()
        self._epoch = 0
        self._saved_batches: set[int] = set()
        self._stored = self._refused = self._failed_saves = 0
        self.counters: dict[str, int] = {
            "loads": 0,
            "load_failures": 0,
            "bytes_restored": 0,
            "save_batches": 0,
            "bytes_saved": 0,
        }

    # ---- registration --------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> BlockGeometry:
        geometry, flat = describe(kv_caches, self.num_blocks)
        if geometry.block_bytes != self.session.block_bytes:
            raise LayoutError(
                f"registered KV pages hold {geometry.block_bytes} bytes per block but the "
                f"KV cache config implies {self.session.block_bytes}"
            )
        self.copier = HostCopier(geometry, flat)
        self._kv = flat
        self._layout = None
        return geometry

    def _pages(self) -> tuple[PageLayout, np.ndarray]:
        """The native page layout and the KV buffer it describes."""
        copier = self._copier()
        assert self._kv is not None
        if self._layout is None:
            self._layout = page_layout(copier.geometry, self._kv.nbytes)
        return self._layout, self._kv

    def _copier(self) -> HostCopier:
        if self.copier is None:
            raise RuntimeError("orbitkv: KV caches were not registered before a transfer")
        return self.copier

    def _sync_epoch(self, meta: OrbitKVConnectorMetadata) -> None:
        if meta.epoch != self._epoch:
            self.session.forget_namespaces()  # re-register after an external reset
            self._epoch = meta.epoch

    # ---- loads ---------------------------------------------------------------------

    def start_load_kv(self, meta: OrbitKVConnectorMetadata) -> None:
        self._sync_epoch(meta)
        if not meta.loads:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.load_workers, thread_name_prefix="orbitkv-load")
        for spec in meta.loads:
            if spec.req_id in self._loads:
                raise AssertionError(f"orbitkv: a load for {spec.req_id} is already in flight")
            self._loads[spec.req_id] = self._pool.submit(self._load, spec)
            self.counters["loads"] += 1

    def _load(self, spec: LoadSpec) -> _LoadOutcome:
        out = _LoadOutcome(spec.req_id)
        copier = self._copier()
        try:
            client = self.session.client()
            ns = self.session.namespace(spec.salt)
            # The scheduler's lease pins these blocks until this load is reported, so
            # this lookup sees at least the same prefix (unless it was corrupted/lost).
            lease = client.lookup(ns, list(spec.hashes))
        except Exception:
            logger.warning("orbitkv: load lookup for %s failed", spec.req_id, exc_info=True)
            out.total_failure = True
            out.failed_block_ids = list(spec.block_ids)
            return out
        try:
            n = min(lease.hit_blocks, len(spec.block_ids))
            if n > 0:
                dst_ids = list(spec.block_ids[:n])
                views = copier.block_views(dst_ids)
                if views is not None:
                    # One contiguous span per block: the native client copies
                    # arena -> pages directly, GIL released.
                    out.bytes_copied = client.restore(lease, [v.data for v in views], start=0, count=n)
                else:
                    # Pages are scattered: the client stages the blocks (acquire) and
                    # scatters each arena slot straight into its pages - one copy, no
                    # staging buffer, every range bounds-checked, under the client's
                    # copy lock; the interface the GPU scatter kernel implements too.
                    layout, kv = self._pages()
                    out.bytes_copied = client.restore_pages(lease, layout, kv, dst_ids)
            out.failed_block_ids = list(spec.block_ids[n:])
            out.total_failure = n == 0
        except Exception:
            logger.warning("orbitkv: restore for %s failed", spec.req_id, exc_info=True)
            out.total_failure = True
            out.failed_block_ids = list(spec.block_ids)
        finally:
            try:
                client.release(lease)
            except Exception:
                logger.debug("orbitkv: worker lease release failed", exc_info=True)
        return out

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        results = KVConnectorTransferResults()
        for req_id, fut in list(self._loads.items()):
            if not fut.done():
                continue
            del self._loads[req_id]
            try:
                out = fut.result()
            except Exception:
                logger.exception("orbitkv: load job for %s crashed", req_id)
                out = _LoadOutcome(req_id, total_failure=True)
            results.finished_recving.add(req_id)
            self.counters["bytes_restored"] += out.bytes_copied
            if out.failed_block_ids or out.total_failure:
                self.counters["load_failures"] += 1
                self._load_errors.update(out.failed_block_ids)
            if out.total_failure:
                results.failed_recving.add(req_id)
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def wait_for_loads(self, timeout: float | None = None) -> None:
        for fut in list(self._loads.values()):
            fut.exception(timeout=timeout)

    # ---- saves ---------------------------------------------------------------------

    def save(self, meta: OrbitKVConnectorMetadata) -> None:
        self._sync_epoch(meta)
        if not meta.saves:
            return
        for spec in meta.saves:
            self._save_one(spec)
        if meta.save_batch is not None:
            self._saved_batches.add(meta.save_batch)
            self.counters["save_batches"] += 1

    def _save_one(self, spec: SaveSpec) -> None:
        self._copier()  # KV caches unregistered is a bug, not a cache failure
        try:
            client = self.session.client()
            ns = self.session.namespace(spec.salt)
            ids: Sequence[int] = list(spec.block_ids)
            # Gather each block straight from its pages into its arena slot, then
            # commit: one copy, no staging buffer (measured faster than the native
            # per-block `save` here, see docs/adapters.md). Blocks already present or
            # refused by admission get no slot. A failed or partial save is never
            # visible: it is aborted on any error (L4).
            layout, kv = self._pages()
            # Leaving the `with` block uncommitted (any error) aborts the save.
            with client.begin_save(ns, list(spec.hashes)) as pending:
                copied = client.save_pages(pending, layout, kv, ids)
                self._stored += client.commit_save(pending)
            self._refused += sum(1 for st in pending.statuses if st == "refused")
            self.counters["bytes_saved"] += copied
        except Exception:
            self._failed_saves += 1
            logger.warning("orbitkv: save for %s failed", spec.req_id, exc_info=True)

    def build_worker_meta(self) -> OrbitKVWorkerMetadata | None:
        if not (self._saved_batches or self._stored or self._refused or self._failed_saves):
            return None
        wm = OrbitKVWorkerMetadata(
            saved_batches=self._saved_batches,
            stored_blocks=self._stored,
            refused_blocks=self._refused,
            failed_saves=self._failed_saves,
        )
        self._saved_batches = set()
        self._stored = self._refused = self._failed_saves = 0
        return wm

    def shutdown(self) -> None:
        """Drain accepted loads before the session closes (L6)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.session.close()
