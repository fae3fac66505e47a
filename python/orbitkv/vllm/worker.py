"""Worker-side role of `OrbitKVConnector` (runs in each vLLM worker process).

Loads run on a small thread pool (the native client releases the GIL), so
`start_load_kv` only submits them and the step never waits on a slow tier; their
completions are harvested by `get_transfer_results`, which reports every started load
exactly once in `finished_recving` (and, if it failed, also in `failed_recving`, with
the failed destination blocks in `get_block_ids_with_load_errors` in the same pass).
Saves run in `wait_for_save`, after the step's forward has written the pages; they
finish before it returns, so no source block outlives the step (L4, best effort).

With `orbitkv.kvcopy` (CUDA pages; CPU pages with `orbitkv.copy_engine = "torch"`) the
worker is a thin caller of the copy engine and both directions are asynchronous:
  * loads: the pool thread looks up and acquires (Manager round trips); the step thread
    issues `CopyEngine.load` and reports the request in `finished_recving` only once the
    handle's `query()` is True, releasing its load lease then (never before);
  * saves: `wait_for_save` records an event after the forward and issues
    `CopyEngine.save(after=event)` per SaveSpec without waiting; each step polls the
    handles, commits completed copies (aborts failed ones: L4) and reports a finished
    request in `finished_sending` once all its saves drained (the scheduler delayed the
    free of every request with a SaveSpec since its last preemption; see scheduler.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

import orbitkv.vllm.compat as compat
from orbitkv.engine.session import connection_lost, is_not_connected
from orbitkv.vllm.config import OrbitKVSettings
from orbitkv.vllm.layout import BlockGeometry, CpuPages, LayoutError, block_geometry, describe
from orbitkv.vllm.metadata import LoadSpec, OrbitKVConnectorMetadata, SaveSpec
from orbitkv.vllm.native import ManagerSession, page_layout
from orbitkv.vllm.stats import WORKER_KEYS, CounterDeltas, LatencySamples, OrbitKVConnectorStats, with_samples
from orbitkv.vllm.worker_jobs import Acquired, KvLoad, KvSave, LoadOutcome, ReqSaves
from orbitkv.vllm.worker_meta import OrbitKVWorkerMetadata

if TYPE_CHECKING:
    from orbitkv._native import Client, Lease, Namespace, PageLayout, PendingSave
    from orbitkv.kvcopy import ArenaView, CopyEngine, LayerPages

logger = logging.getLogger("orbitkv.vllm")


LOAD_POLL_S = 0.0002  # how often orbitkv.load_wait_us looks at the copies in flight


def _copied(ld: KvLoad) -> bool:
    """The load's acquire returned and its copy (if any) completed or failed."""
    if ld.acquired is None:
        return False
    try:
        return ld.handle is None or ld.handle.query()
    except Exception:
        return True  # failed: reported by _collect_loads


def _log_failure(exc: BaseException, what: str, req_id: str) -> None:
    """A failed transfer: with its traceback, unless the session has no connection yet
    (a back-off or a background reconnect runs; that was logged once, not per request)."""
    if is_not_connected(exc):
        logger.debug("orbitkv: " + what + " (%s)", req_id, exc)
    else:
        logger.warning("orbitkv: " + what, req_id, exc_info=True)


def _is_engine_error(exc: BaseException) -> bool:
    """The copy engine cannot work here (pinning, capture misuse): a configuration error
    to raise, never a cache miss to log."""
    from orbitkv.kvcopy import CopyEngineError

    return isinstance(exc, CopyEngineError)


class OrbitKVWorker:
    def __init__(
        self, settings: OrbitKVSettings, session: ManagerSession, num_blocks: int, *, kvcopy: bool = False
    ) -> None:
        self.settings = settings
        self.session = session
        self.num_blocks = num_blocks
        # Copies go through orbitkv.kvcopy (asynchronous) instead of the native client.
        self.kvcopy = kvcopy
        self.engine: CopyEngine | None = None
        self._arena: ArenaView | None = None
        self._layer_pages: list[LayerPages] | None = None
        self._device: torch.device | None = None
        self._engine_session = -1  # session id of the Client the arena view maps
        self._kv_loads: dict[str, KvLoad] = {}
        self._kv_saves: list[KvSave] = []
        # The release's runner rewrites blocks before it reports preemptions (vLLM 0.34):
        # each step's saves are then ordered before the next step's device work.
        self._saves_before_next_step: bool = compat.current().SAVES_BEFORE_NEXT_STEP
        self._save_reqs: dict[str, ReqSaves] = {}  # SaveSpec seen since the last preemption
        self._finishing: set[str] = set()  # finished, reported once their saves drained
        self._batch_saves: dict[int, int] = {}  # save batch -> saves still in flight
        self.cpu_pages: CpuPages | None = None  # registered CPU pages (native copy path)
        self._kv: np.ndarray | None = None  # the whole KV backing buffer, as bytes
        self._layout: PageLayout | None = None  # native geometry, built on first transfer (O4)
        self._pool: ThreadPoolExecutor | None = None
        self._loads: dict[str, Future[LoadOutcome]] = {}
        self._load_errors: set[int] = set()
        self._epoch = 0
        self._asleep = False  # KV caches unregistered for sleep mode (vLLM 0.33.0)
        self._wm = OrbitKVWorkerMetadata()  # what the next step's worker metadata tells the scheduler
        self.counters: dict[str, int] = {
            "loads": 0,
            "load_failures": 0,
            "bytes_restored": 0,
            "save_batches": 0,
            "bytes_saved": 0,
        }
        self._broken = False  # kvcopy: the session's connection broke; rebind when idle
        self._load_started: dict[str, float] = {}  # req_id -> start_load_kv time
        self.load_seconds = 0.0  # summed load durations (vLLM connector stats)
        self._stats = CounterDeltas(WORKER_KEYS)
        self._latency = LatencySamples()  # per-request load and save durations

    # ---- registration --------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> BlockGeometry:
        if self.kvcopy:
            return self._register_kvcopy(kv_caches)
        for name, t in kv_caches.items():
            if t.device.type != "cpu":
                raise LayoutError(
                    f"layer {name!r} lives on {t.device}, but this worker copies with the native client, "
                    "which needs CPU pages (orbitkv.copy_engine='auto' and a vLLM device type other than "
                    "cuda); run vLLM on CUDA, or set orbitkv.copy_engine='torch' to copy through orbitkv.kvcopy"
                )
        geometry, flat = describe(kv_caches, self.num_blocks)
        if geometry.block_bytes != self.session.block_bytes:
            raise LayoutError(
                f"registered KV pages hold {geometry.block_bytes} bytes per block but the "
                f"KV cache config implies {self.session.block_bytes}"
            )
        self.cpu_pages = CpuPages(geometry, flat)
        self._kv = flat
        self._layout = None
        return geometry

    def _register_kvcopy(self, kv_caches: dict[str, torch.Tensor]) -> BlockGeometry:
        from orbitkv.kvcopy import layer_pages

        geometry = block_geometry(kv_caches, self.num_blocks)
        if geometry.block_bytes != self.session.block_bytes:
            raise LayoutError(
                f"registered KV pages hold {geometry.block_bytes} bytes per block but the "
                f"KV cache config implies {self.session.block_bytes}"
            )
        self._layer_pages = layer_pages(kv_caches, self.num_blocks)
        self._device = self._layer_pages[0].backing.device
        try:
            self.session.client()
        except Exception as exc:
            # No Manager yet: the arena is pinned on the first transfer that reaches one.
            logger.warning("orbitkv: Manager not reachable at KV registration (%s); pinning deferred", exc)
            return geometry
        self._kv_engine()  # pin now, before serving: a pinning failure is raised here
        return geometry

    def _kv_engine(self) -> CopyEngine:
        """The copy engine over this worker's Client (connecting and pinning the arena
        once). A pinning failure raises CopyEngineError: there is no CPU fallback."""
        if self._layer_pages is None:
            raise RuntimeError("orbitkv: KV caches were not registered before a transfer")
        client = self.session.client()
        if self.engine is not None:
            if self._engine_session != client.session_id:
                raise RuntimeError(
                    "orbitkv: the worker's Manager session changed under its pinned arena view; "
                    "the worker keeps one session for its lifetime"
                )
            return self.engine
        from orbitkv.kvcopy import ArenaView, CopyEngine, CopyEngineError

        assert self._device is not None
        logger.info("orbitkv: mapping the Manager arena for KV pages on %s", self._device)
        arena = ArenaView(client, self._device, progress=lambda line: logger.info("orbitkv: %s", line))
        try:
            self.engine = CopyEngine(self._layer_pages, arena, kernel=self.settings.copy_kernel)
        except CopyEngineError as exc:
            arena.close()
            raise CopyEngineError(f"{exc} (setting orbitkv.copy_kernel = {self.settings.copy_kernel!r})") from exc
        except BaseException:
            arena.close()
            raise
        self._arena = arena
        self._engine_session = client.session_id
        logger.info(
            "orbitkv: copy engine ready on %s (%d layers; kernel %s: %s)",
            self._device,
            len(self._layer_pages),
            self.engine.kernel,
            self.engine.kernel_reason,
        )
        return self.engine

    def _pages(self) -> tuple[PageLayout, np.ndarray]:
        """The native page layout and the KV buffer it describes."""
        pages = self._cpu_pages()
        assert self._kv is not None
        if self._layout is None:
            self._layout = page_layout(pages.geometry, self._kv.nbytes)
        return self._layout, self._kv

    def _cpu_pages(self) -> CpuPages:
        if self.cpu_pages is None:
            raise RuntimeError("orbitkv: KV caches were not registered before a transfer")
        return self.cpu_pages

    def _sync_epoch(self, meta: OrbitKVConnectorMetadata) -> None:
        if meta.epoch != self._epoch:
            self.session.forget_namespaces()  # re-register after an external reset
            self._epoch = meta.epoch

    # ---- loads ---------------------------------------------------------------------

    def start_load_kv(self, meta: OrbitKVConnectorMetadata) -> None:
        self._sync_epoch(meta)
        if not meta.loads:
            return
        self._check_awake("a load")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.load_workers, thread_name_prefix="orbitkv-load")
        for spec in meta.loads:
            if spec.req_id in self._loads or spec.req_id in self._kv_loads:
                raise AssertionError(f"orbitkv: a load for {spec.req_id} is already in flight")
            if self.kvcopy:
                self._kv_loads[spec.req_id] = KvLoad(self._pool.submit(self._acquire, spec))
            else:
                self._loads[spec.req_id] = self._pool.submit(self._load, spec)
            self.counters["loads"] += 1
            self._load_started[spec.req_id] = time.perf_counter()
        self._issue_loads()

    # ---- loads through orbitkv.kvcopy ---------------------------------------------

    def _acquire(self, spec: LoadSpec) -> Acquired:
        """Pool thread: look the hashes up under this worker's session and stage them
        (acquire). No copy here: the step thread issues it on the engine's load stream."""
        acq = Acquired(LoadOutcome(spec.req_id))
        try:
            # The loads' own connection: an acquire staging from SSD holds it, not the
            # connection the step's save calls use.
            client = self.session.loader()
            ns = self.session.loader_namespace(spec.salt)
            acq.lease = self._take_lease(client, ns, spec)
            n = min(acq.lease.hit_blocks, len(spec.block_ids))
            if n > 0:
                from orbitkv.kvcopy import slots_array

                # packed int64 (segment, offset) pairs: no Python object per block
                acq.slots = slots_array(client.acquire_packed(acq.lease))[:n]
                acq.block_ids = list(spec.block_ids[:n])
            acq.out.failed_block_ids = list(spec.block_ids[n:])
            acq.out.total_failure = n == 0
        except Exception as exc:
            _log_failure(exc, "load lookup/acquire for %s failed", spec.req_id)
            self._connection_failed(exc)
            acq.out.total_failure = True
            acq.out.failed_block_ids = list(spec.block_ids)
            acq.slots, acq.block_ids = np.empty((0, 2), dtype=np.int64), []
        return acq

    @staticmethod
    def _take_lease(client: Client, ns: Namespace, spec: LoadSpec) -> Lease:
        """The lease this load copies from: this rank's part of the scheduler's TP lease
        (redeemed with its token, no second lookup: T1), else a lookup of its own."""
        if spec.token is not None:
            return client.redeem_tp(spec.token, ns)
        return client.lookup(ns, list(spec.hashes))

    def _issue_loads(self) -> None:
        """Step thread: issue the copy of every load whose acquire returned."""
        for ld in self._kv_loads.values():
            if ld.acquired is not None or not ld.future.done():
                continue
            try:
                ld.acquired = ld.future.result()
            except Exception:
                logger.exception("orbitkv: load job crashed")
                ld.acquired = Acquired(LoadOutcome("?", total_failure=True))
            acq = ld.acquired
            if len(acq.slots) == 0:
                continue
            try:
                ld.handle = self._kv_engine().load(acq.slots, acq.block_ids)
                acq.out.bytes_copied = len(acq.slots) * self.session.block_bytes
            except Exception as exc:
                logger.warning("orbitkv: issuing the restore for %s failed", acq.out.req_id, exc_info=True)
                acq.out.total_failure = True
                acq.out.failed_block_ids = list(acq.block_ids) + acq.out.failed_block_ids
                if _is_engine_error(exc):
                    raise

    def _collect_loads(self) -> list[LoadOutcome]:
        """Loads whose copy completed (or that failed), lease released; no host sync."""
        self._issue_loads()
        done: list[LoadOutcome] = []
        for req_id, ld in list(self._kv_loads.items()):
            acq = ld.acquired
            if acq is None:
                continue
            if ld.handle is not None:
                try:
                    if not ld.handle.query():
                        continue  # still copying: the lease keeps pinning the sources
                except Exception:
                    logger.warning("orbitkv: restore for %s failed", req_id, exc_info=True)
                    acq.out.total_failure = True
                    acq.out.failed_block_ids = list(acq.block_ids) + acq.out.failed_block_ids
            del self._kv_loads[req_id]
            self._release_load_lease(acq)
            acq.out.req_id = req_id
            done.append(acq.out)
        return done

    def _release_load_lease(self, acq: Acquired) -> None:
        lease, acq.lease = acq.lease, None
        if lease is None:
            return
        try:
            # Through the connection that holds it; gone with its session: nothing to do.
            self.session.release(lease)
        except Exception as exc:
            logger.debug("orbitkv: worker lease release failed", exc_info=True)
            self._connection_failed(exc)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """A no-op, correctly: every OrbitKV load is asynchronous (the scheduler answers
        load_async=True), so vLLM runs a request only after its load was reported in
        finished_recving, i.e. after `LoadHandle.query()` was True - its pages are
        complete before any forward reads them. (Loads inside the step, load_async=False,
        are not offered: see docs/adapters.md, "Why every load is asynchronous".)"""
        return None

    def _load(self, spec: LoadSpec) -> LoadOutcome:
        out = LoadOutcome(spec.req_id)
        pages = self._cpu_pages()
        try:
            client = self.session.loader()  # the loads' own connection (see `_acquire`)
            ns = self.session.loader_namespace(spec.salt)
            # The scheduler's lease pins these blocks until this load is reported, so
            # this lookup sees at least the same prefix (unless it was corrupted/lost).
            lease = self._take_lease(client, ns, spec)
        except Exception as exc:
            logger.warning("orbitkv: load lookup for %s failed", spec.req_id, exc_info=True)
            self._connection_failed(exc)
            out.total_failure = True
            out.failed_block_ids = list(spec.block_ids)
            return out
        try:
            n = min(lease.hit_blocks, len(spec.block_ids))
            if n > 0:
                dst_ids = list(spec.block_ids[:n])
                views = pages.block_views(dst_ids)
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
                    # numpy's stubs give ndarray `__buffer__` only on Python >= 3.12
                    # (numpy/numpy#26783); the array exports the buffer protocol on 3.11 too.
                    out.bytes_copied = client.restore_pages(lease, layout, kv, dst_ids)  # type: ignore[arg-type]
            out.failed_block_ids = list(spec.block_ids[n:])
            out.total_failure = n == 0
        except Exception as exc:
            logger.warning("orbitkv: restore for %s failed", spec.req_id, exc_info=True)
            self._connection_failed(exc)
            out.total_failure = True
            out.failed_block_ids = list(spec.block_ids)
        finally:
            try:
                client.release(lease, wait=False)
            except Exception as exc:
                # The copy above read the arena this process still maps: a Manager that
                # died after the acquire loses the release, not the bytes (L7).
                logger.debug("orbitkv: worker lease release failed", exc_info=True)
                self._connection_failed(exc)
        return out

    def _connection_failed(self, exc: BaseException) -> None:
        """A broken connection is dropped so that the next transfer reconnects (a Manager
        that restarted serves again). With orbitkv.kvcopy the copy engine reads and writes
        the session's arena mapping, so the session is only marked broken here and is
        dropped by `_rebind_if_broken` once no copy is in flight."""
        if not self.kvcopy:
            self.session.drop_if_broken(exc)
        elif connection_lost(exc):
            self._broken = True

    def _rebind_if_broken(self) -> None:
        """kvcopy: after a broken connection, once nothing is in flight, drain the engine,
        unpin the old arena and drop the session; the next transfer connects again and
        maps (and pins) the new Manager's arena."""
        if not self._broken or self._kv_loads or self._kv_saves:
            return
        self._broken = False
        if self.engine is not None:
            self.engine.drain()
        if self._arena is not None:
            self._arena.close()
        self.engine, self._arena, self._engine_session = None, None, -1
        self.session.drop_client()
        logger.warning("orbitkv: Manager connection lost; the arena view was released, the next transfer reconnects")

    def _wait_for_loads(self) -> None:
        """`orbitkv.load_wait_us`: before this step's results are collected, wait up to
        that long for the loads in flight to complete, so that a load started in this step
        is reported in this step's output and its request runs in the next step (not the
        one after). A load still copying when the wait ends is reported in a later step."""
        budget = self.settings.load_wait_us / 1e6
        if budget <= 0 or not (self._loads or self._kv_loads):
            return
        deadline = time.perf_counter() + budget
        if not self.kvcopy:
            wait_futures(list(self._loads.values()), timeout=budget)
            return
        wait_futures([ld.future for ld in self._kv_loads.values()], timeout=budget)
        self._issue_loads()
        while time.perf_counter() < deadline and not all(_copied(ld) for ld in self._kv_loads.values()):
            time.sleep(LOAD_POLL_S)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        self._wait_for_loads()
        results = KVConnectorTransferResults()
        if self.kvcopy:
            for out in self._collect_loads():
                self._report_load(results, out)
            self._poll_saves()
            self._rebind_if_broken()
            self._finishing |= finished_req_ids & self._save_reqs.keys()
            for req_id in sorted(self._finishing):
                if self._save_reqs[req_id].in_flight == 0:
                    results.finished_sending.add(req_id)  # its blocks may be freed now
                    self._finishing.discard(req_id)
                    del self._save_reqs[req_id]
            return results
        for req_id, fut in list(self._loads.items()):
            if not fut.done():
                continue
            del self._loads[req_id]
            try:
                out = fut.result()
            except Exception:
                logger.exception("orbitkv: load job for %s crashed", req_id)
                out = LoadOutcome(req_id, total_failure=True)
            self._report_load(results, out)
        return results

    def _report_load(self, results: KVConnectorTransferResults, out: LoadOutcome) -> None:
        results.finished_recving.add(out.req_id)
        started = self._load_started.pop(out.req_id, None)
        if started is not None:
            took = time.perf_counter() - started
            self.load_seconds += took
            self._latency.add("load_duration", took)
        if not out.total_failure:
            self.counters["bytes_restored"] += out.bytes_copied
        if out.failed_block_ids or out.total_failure:
            self.counters["load_failures"] += 1
            self._load_errors.update(out.failed_block_ids)
        if out.total_failure:
            results.failed_recving.add(out.req_id)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def wait_for_loads(self, timeout: float | None = None) -> None:
        for fut in list(self._loads.values()):
            fut.exception(timeout=timeout)
        for ld in list(self._kv_loads.values()):
            ld.future.exception(timeout=timeout)

    # ---- saves ---------------------------------------------------------------------

    def save(self, meta: OrbitKVConnectorMetadata) -> None:
        self._sync_epoch(meta)
        if not meta.saves:
            return
        self._check_awake("a save")
        if self.kvcopy:
            self._save_kvcopy(meta)
            return
        for spec in meta.saves:
            self._save_one(spec)
        if meta.save_batch is not None:
            self._wm.saved_batches.add(meta.save_batch)
            self.counters["save_batches"] += 1

    # ---- saves through orbitkv.kvcopy ---------------------------------------------

    def _save_kvcopy(self, meta: OrbitKVConnectorMetadata) -> None:
        """Issue every SaveSpec of the step on the engine's save stream, ordered after the
        forward by one event recorded here; nothing waits for the copies."""
        if self._layer_pages is None:
            raise RuntimeError("orbitkv: KV caches were not registered before a transfer")
        batch = meta.save_batch
        if batch is not None:
            self._batch_saves[batch] = 0
            self.counters["save_batches"] += 1
        after = None
        if self._device is not None and self._device.type == "cuda":
            after = torch.cuda.Event()
            after.record(torch.cuda.current_stream(self._device))
        for spec in meta.saves:
            # The scheduler delays this request's free from now on (same rule): record it
            # before anything can fail, so its finish is always reported.
            req = self._save_reqs.setdefault(spec.req_id, ReqSaves())
            rec = self._issue_save(spec, req, batch, after)
            if rec is not None:
                req.in_flight += 1
                if batch is not None:
                    self._batch_saves[batch] += 1
                self._kv_saves.append(rec)
        if batch is not None and self._batch_saves[batch] == 0:
            del self._batch_saves[batch]
            self._wm.saved_batches.add(batch)
        engine = self.engine
        if self._saves_before_next_step and after is not None and self._kv_saves and engine is not None:
            # vLLM 0.34's runner zeroes new blocks and applies copy-on-write copies on the
            # current stream before it reports preemptions to `handle_preemptions`: a block
            # a preempted request freed could be rewritten while a save still reads it. So
            # the current stream waits (device-side, no host sync) until these saves have
            # read their pages, before the next step's work.
            engine.wait_saves()

    def _issue_save(
        self, spec: SaveSpec, req: ReqSaves, batch: int | None, after: torch.cuda.Event | None
    ) -> KvSave | None:
        started = time.perf_counter()
        try:
            engine = self._kv_engine()
            client = self.session.client()
            ns = self.session.namespace(spec.salt)
            pending = client.begin_save(ns, list(spec.hashes))
        except Exception as exc:
            self._wm.failed_saves += 1
            _log_failure(exc, "save for %s failed", spec.req_id)
            if _is_engine_error(exc):
                raise
            self._connection_failed(exc)
            return None
        try:
            # Blocks already present or refused by admission get no slot and no copy.
            from orbitkv.kvcopy import slots_array

            slots = slots_array(pending.packed_slots)
            allocated = slots[:, 0] >= 0
            copied = int(allocated.sum())
            handle = None
            if copied:
                ids = np.asarray(spec.block_ids, dtype=np.int64)[allocated]
                handle = engine.save(ids, slots[allocated], after=after)
        except Exception as exc:
            self._abort(pending, spec)
            if _is_engine_error(exc):
                raise
            return None
        return KvSave(spec, pending, handle, req, batch, copied * self.session.block_bytes, started)

    def _abort(self, pending: PendingSave, spec: SaveSpec) -> None:
        """A failed or unproven copy is never visible (L4)."""
        self._wm.failed_saves += 1
        logger.warning("orbitkv: save for %s failed; aborting it", spec.req_id, exc_info=True)
        if pending.done:
            return
        try:
            self.session.client().abort_save(pending)
        except Exception as exc:
            logger.debug("orbitkv: abort_save failed (the Manager frees it with the session)", exc_info=True)
            self._connection_failed(exc)

    def _poll_saves(self, *, final: bool = False) -> None:
        """Commit every save whose copy completed, abort failed ones (no host sync).
        `final`: the engine was drained; a copy still not proven complete is aborted."""
        still: list[KvSave] = []
        for rec in self._kv_saves:
            try:
                done = rec.handle is None or rec.handle.query()
            except Exception:
                self._abort(rec.pending, rec.spec)
                self._save_done(rec)
                continue
            if not done:
                if final:
                    logger.warning("orbitkv: save for %s not complete at shutdown; aborting", rec.spec.req_id)
                    self._abort(rec.pending, rec.spec)
                    self._save_done(rec)
                else:
                    still.append(rec)
                continue
            try:
                self._wm.stored_blocks += self.session.client().commit_save(rec.pending)
                self._wm.refused_blocks += sum(1 for st in rec.pending.statuses if st == "refused")
                self.counters["bytes_saved"] += rec.bytes
                self._latency.add("save_duration", time.perf_counter() - rec.started)
            except Exception as exc:
                self._connection_failed(exc)
                self._abort(rec.pending, rec.spec)
            self._save_done(rec)
        self._kv_saves = still

    def _save_done(self, rec: KvSave) -> None:
        rec.req.in_flight -= 1
        if rec.batch is not None:
            left = self._batch_saves[rec.batch] - 1
            if left:
                self._batch_saves[rec.batch] = left
            else:
                del self._batch_saves[rec.batch]
                self._wm.saved_batches.add(rec.batch)

    def handle_preemptions(self, meta: OrbitKVConnectorMetadata) -> None:
        """Called before the step's metadata is bound: preempted requests' blocks may be
        reused by this step. Saves still reading them are ordered before any later work:
        the current stream waits for the save stream (a device-side wait, no host sync);
        loads are issued after work already on the current stream. The requests stop
        holding their finish on those saves (the scheduler drops them in the same order)."""
        if not self.kvcopy or not meta.preempted:
            return
        reading = False
        for req_id in meta.preempted:
            req = self._save_reqs.pop(req_id, None)
            self._finishing.discard(req_id)
            reading |= req is not None and req.in_flight > 0
        engine = self.engine
        if reading and engine is not None and engine.device.type == "cuda":
            engine.wait_saves()  # device-side: the next forward waits until the saves read

    def _save_one(self, spec: SaveSpec) -> None:
        self._cpu_pages()  # KV caches unregistered is a bug, not a cache failure
        started = time.perf_counter()
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
                # numpy's stubs give ndarray `__buffer__` only on Python >= 3.12
                # (numpy/numpy#26783); the array exports the buffer protocol on 3.11 too.
                copied = client.save_pages(pending, layout, kv, ids)  # type: ignore[arg-type]
                self._wm.stored_blocks += client.commit_save(pending)
            self._wm.refused_blocks += sum(1 for st in pending.statuses if st == "refused")
            self.counters["bytes_saved"] += copied
            self._latency.add("save_duration", time.perf_counter() - started)
        except Exception as exc:
            self._wm.failed_saves += 1
            _log_failure(exc, "save for %s failed", spec.req_id)
            self._connection_failed(exc)

    def connector_stats(self) -> OrbitKVConnectorStats | None:
        """Counter increments since the last call (vLLM's `get_kv_connector_stats`)."""
        samples = self._latency.drain()
        deltas = self._stats.take(
            self.counters, load_seconds=self.load_seconds, latency_samples_dropped=self._latency.dropped
        )
        return with_samples(deltas, samples)

    def build_worker_meta(self) -> OrbitKVWorkerMetadata | None:
        if self._wm.empty():
            return None
        wm, self._wm = self._wm, OrbitKVWorkerMetadata()
        return wm

    # ---- sleep mode (vLLM 0.33.0: unregister_kv_caches / restore_kv_caches) ----------

    def _check_awake(self, what: str) -> None:
        if self._asleep:
            raise RuntimeError(
                f"orbitkv: {what} was requested while the KV caches are unregistered for sleep mode "
                "(vLLM called unregister_kv_caches and not yet restore_kv_caches)"
            )

    def unregister_kv_caches(self) -> None:
        """Before vLLM releases the KV memory (sleep): every copy touching the pages has
        completed when this returns, and no transfer starts until `restore_kv_caches`.
        Loads and saves stay tracked: their completions are reported after the wake-up
        as usual. Idempotent."""
        if self._asleep:
            return
        for fut in list(self._loads.values()):
            fut.exception()  # waits: native loads copy on the pool threads
        for ld in self._kv_loads.values():
            ld.future.exception()  # waits for the acquire; the copy is issued below
        if self.kvcopy:
            self._issue_loads()
        if self.engine is not None:
            self.engine.drain()  # both streams: issued loads and saves have completed
        self._asleep = True
        logger.info("orbitkv: KV caches unregistered (sleep mode); transfers refused until restored")

    def restore_kv_caches(self) -> None:
        """After the wake-up: vLLM maps the KV cache at the same addresses again, so the
        registered pages (and the copy engine's views of them) are valid again. Idempotent."""
        if self._asleep:
            self._asleep = False
            logger.info("orbitkv: KV caches restored after sleep mode")

    def shutdown(self) -> None:
        """Drain accepted loads and in-flight copies before the session closes (L6):
        acquires return, the engine's streams drain, completed saves commit (others
        abort), load leases are released, the arena view is unpinned, then the Client
        closes."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.engine is not None:
            self.engine.drain()
        if self._kv_saves:
            self._poll_saves(final=True)
        for ld in self._kv_loads.values():
            if ld.acquired is None and ld.future.done():
                try:
                    ld.acquired = ld.future.result()
                except Exception:
                    logger.debug("orbitkv: load job crashed", exc_info=True)
            if ld.acquired is not None:
                self._release_load_lease(ld.acquired)
        self._kv_loads.clear()
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        self.engine = None
        self.session.close()
