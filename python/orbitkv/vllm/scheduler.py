"""Scheduler-side role of `OrbitKVConnector` (runs next to vLLM's `Scheduler`).

Per request:
  * at most one Manager lookup, over `request.block_hashes[start:stop]` where `start`
    is the engine's own (block-aligned) HBM hit and `stop` the engine's cap of
    `(num_tokens - 1) // block_size` blocks. Blocks the engine already holds are
    never queried (O5); a full native hit issues no lookup at all;
  * before it, the Manager's shared presence table is read (no message): when block
    `start` is certainly absent the request misses at once. Otherwise the lookup runs
    on a background thread and `get_num_new_matched_tokens` returns None ("ask again
    next step", honoured by vLLM 0.31 and 0.33: the request is skipped this step), so
    the scheduler thread never waits for a Manager round trip on a probable hit; the
    answer (its lease pinning the hit) is taken on a later step. A lookup that fails
    (the Manager died meanwhile) is a miss;
  * a hit is loaded asynchronously: vLLM parks the request in
    `WAITING_FOR_REMOTE_KVS` until a worker reports it in `finished_recving`;
  * the lease from the lookup pins the hit until that report (L1/L2), and is released
    at once when vLLM does not select the hit (`num_external_tokens == 0`), on
    preemption, and on finish/abort of a request that is not loading;
  * complete blocks the engine computes are saved by the workers after the step's
    forward (L4: best effort). With asynchronous saves (`orbitkv.kvcopy`: CUDA pages,
    or `orbitkv.copy_engine = "torch"`) a finished request that had saves planned
    since its last preemption keeps its blocks (`request_finished` returns True) until
    every worker reports it in `finished_sending`, i.e. until those copies completed;
  * a retention hint in `kv_transfer_params["orbitkv_retention"]` (`orbitkv.engine.hints`)
    is sent to the Manager when the request finishes, for its whole block chain; a
    malformed one is logged, counted (`hints_rejected`) and ignored.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orbitkv.engine.hints import HintError, RetentionHint, parse_hint
from orbitkv.engine.session import connection_lost, is_error
from orbitkv.vllm.config import OrbitKVSettings
from orbitkv.vllm.metadata import LoadSpec, OrbitKVConnectorMetadata, SaveSpec
from orbitkv.vllm.native import ManagerSession
from orbitkv.vllm.stats import SCHEDULER_KEYS, CounterDeltas, OrbitKVConnectorStats
from orbitkv.vllm.tp import token_of
from orbitkv.vllm.worker_meta import OrbitKVWorkerMetadata

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from orbitkv._native import Lease, PendingLookup, TpLease

logger = logging.getLogger("orbitkv.vllm")


@dataclass
class _ReqState:
    request: Request
    salt: bytes
    bypass: str | None  # why OrbitKV does not serve this request (None: it does)
    local_hit_blocks: int = 0
    lease: Lease | TpLease | None = None
    lease_start: int = -1  # start block of the last lookup (-1: none yet)
    hit_blocks: int = 0
    pending: PendingLookup | Future[Lease | TpLease] | None = None  # a background lookup not yet taken
    pending_since: float = 0.0  # perf_counter() when it started
    loading: bool = False
    load_done: bool = False  # a load just drained; the next alloc call is its follow-up
    preemptions: int = 0  # request.num_preemptions when the last lookup was made
    load_block_ids: tuple[int, ...] = ()
    finished: bool = False
    save_from: int = 0  # first block this request computes itself
    saved_upto: int = 0  # blocks [0, saved_upto) were planned for saving
    # Saves were planned from this request's current blocks (since its last preemption)
    # and complete asynchronously: its finish must wait for finished_sending.
    saving: bool = False
    hint: RetentionHint | None = None  # the application's retention hint, sent at finish


def bypass_reason(request: Request, settings: OrbitKVSettings) -> str | None:
    """Requests whose keys could alias or whose state could change under a key (K3/K4)."""
    if getattr(request, "resumable", False) or getattr(request, "streaming_queue", None) is not None:
        return "resumable/session request"
    if request.mm_features:
        return "multimodal request (not qualified)"
    lora = request.lora_request
    if lora is not None:
        declared = settings.static_lora_adapters.get(lora.lora_name)
        if declared is None:
            return f"undeclared LoRA adapter {lora.lora_name!r}"
        if not lora.lora_path or os.path.realpath(lora.lora_path) != declared:
            return f"LoRA adapter {lora.lora_name!r} path differs from its declared path"
        if getattr(lora, "load_inplace", False):
            return f"LoRA adapter {lora.lora_name!r} requested an in-place reload"
    return None


class OrbitKVScheduler:
    """Scheduler-role state and decisions; owns no engine memory (O1)."""

    def __init__(
        self, settings: OrbitKVSettings, session: ManagerSession, block_size: int, *, async_saves: bool = False
    ) -> None:
        self.settings = settings
        self.session = session
        self.block_size = block_size
        # Workers complete saves after the step (orbitkv.kvcopy): finishing requests wait.
        self.async_saves = async_saves
        self._reqs: dict[str, _ReqState] = {}
        self._sending: set[str] = set()  # finished, blocks held until finished_sending
        self._pending_loads: list[LoadSpec] = []
        self._pending_save_batches: set[int] = set()
        self._next_batch = 0
        self._epoch = 0
        self.counters: dict[str, int] = {
            "lookups": 0,
            "lookup_blocks": 0,
            "hit_blocks": 0,
            "loads_started": 0,
            "loads_finished": 0,
            "loads_failed": 0,
            "leases_released": 0,
            "leases_lost_with_session": 0,
            "unselected_leases": 0,
            "save_blocks_planned": 0,
            "saved_blocks": 0,
            "refused_blocks": 0,
            "failed_saves": 0,
            "bypassed_requests": 0,
            "manager_errors": 0,
            "resets": 0,
            "delayed_frees": 0,
        }
        self.counters.update(
            {"presence_misses": 0, "async_lookups": 0, "lookups_answered_in_step": 0, "stale_lookups": 0}
        )
        self.counters.update({"hints_sent": 0, "hint_blocks": 0, "hints_rejected": 0})
        # Seconds of successful lookups (vLLM connector stats): inline, the round trip;
        # in the background, from its start until the scheduler took its answer.
        self.lookup_seconds = 0.0
        # What is left of this step's wait for background lookups (orbitkv.lookup_wait_us);
        # refilled when the step's metadata is built.
        self._wait_left = self.settings.lookup_wait_us / 1e6
        self._stats = CounterDeltas(SCHEDULER_KEYS)
        # Background lookups (one thread: the session's connection serves one request at
        # a time anyway). Their leases are taken, or released, on the scheduler thread.
        self._lookups: ThreadPoolExecutor | None = None
        # Lookups whose request moved on (finished, native hit moved, preempted) before
        # their answer was taken: their leases are released once they complete.
        self._orphans: list[PendingLookup | Future[Lease | TpLease]] = []

    # ---- helpers -------------------------------------------------------------------

    def _state(self, request: Request) -> _ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:
            salt = (request.cache_salt or "").encode()
            reason = bypass_reason(request, self.settings)
            if reason is not None:
                self.counters["bypassed_requests"] += 1
                logger.warning("orbitkv: not caching request %s: %s", request.request_id, reason)
            st = _ReqState(request=request, salt=salt, bypass=reason)
            if reason is None:
                st.hint = self._parse_hint(request)
            self._reqs[request.request_id] = st
        return st

    def _parse_hint(self, request: Request) -> RetentionHint | None:
        try:
            return parse_hint(request.kv_transfer_params)
        except HintError as exc:
            self.counters["hints_rejected"] += 1
            logger.error("orbitkv: request %s: %s; it runs without a retention hint", request.request_id, exc)
            return None

    def _send_hint(self, st: _ReqState) -> None:
        """Tell the Manager the finished request's retention hint, for its block chain
        (blocks not committed yet take it when their save commits)."""
        hint, st.hint = st.hint, None
        request = st.request
        n = min(len(request.block_hashes), max(st.saved_upto, request.num_computed_tokens // self.block_size))
        if hint is None or n <= 0:
            return
        hashes = list(request.block_hashes[:n])
        try:
            client = self.session.client()
            if self.settings.query_control:
                nss = self.session.shard_namespaces(st.salt)
            else:
                nss = [self.session.namespace(st.salt)]
            for ns in nss:
                applied, pending, _ = client.retain(ns, hashes, **hint.as_kwargs())
                self.counters["hint_blocks"] += applied + pending
        except Exception as exc:
            self.counters["manager_errors"] += 1
            logger.warning("orbitkv: retention hint of request %s failed: %s", request.request_id, exc)
            if connection_lost(exc):
                self.session.drop_client()
            return
        self.counters["hints_sent"] += 1

    def _release(self, st: _ReqState) -> None:
        lease, st.lease = st.lease, None
        st.hit_blocks = 0
        if lease is not None:
            self._release_lease(lease)

    def _release_lease(self, lease: Lease | TpLease) -> None:
        try:
            if self.session.release(lease):
                self.counters["leases_released"] += 1
            else:
                self.counters["leases_lost_with_session"] += 1
        except Exception as exc:
            self.counters["manager_errors"] += 1
            logger.warning("orbitkv: releasing a lease failed: %s", exc)
            if connection_lost(exc):
                self.session.drop_client()

    def _lookup_call(self, salt: bytes, hashes: list[bytes]) -> Lease | TpLease:
        """One Manager lookup (on the scheduler thread, or on the background thread)."""
        if self.settings.query_control:
            # T1: one call over every rank's shard; the common prefix is pinned in
            # each under one TP lease the workers redeem (orbitkv.vllm.tp).
            return self.session.client().lookup_tp(self.session.shard_namespaces(salt), hashes)
        return self.session.client().lookup(self.session.namespace(salt), hashes)

    def _lookup_failed(self, exc: BaseException) -> None:
        self.counters["manager_errors"] += 1
        level = logging.DEBUG if is_error(exc, "ManagerUnavailable") else logging.WARNING
        logger.log(level, "orbitkv: lookup failed, treating as a miss: %s", exc)
        if connection_lost(exc):
            self.session.drop_client()

    def _certainly_absent(self, st: _ReqState, first: bytes) -> bool:
        """The presence table (no message) says block `first` is not in the Manager."""
        try:
            # With TP, shard 0 lacking the block empties the common prefix too.
            if self.settings.query_control:
                ns = self.session.shard_namespaces(st.salt)[0]
            else:
                ns = self.session.namespace(st.salt)
            # Without a table (--presence-slots off) the answer is 1: "maybe".
            return self.session.client().probably_present(ns, (first,)) == 0
        except Exception as exc:
            self._lookup_failed(exc)
            return True  # no Manager to ask: a miss, as a failed lookup would be

    def _take(self, st: _ReqState, lease: Lease | TpLease, queried: int) -> int:
        self.counters["lookups"] += 1
        self.counters["lookup_blocks"] += queried
        hit = min(lease.hit_blocks, queried)
        if hit == 0:
            st.lease = lease
            self._release(st)
            return 0
        st.lease, st.hit_blocks = lease, hit
        self.counters["hit_blocks"] += hit
        return hit

    def _lookup(self, st: _ReqState, start: int, stop: int) -> int | None:
        """Look up blocks [start, stop): the hit now, or None while a background
        lookup is in flight (vLLM asks again next step)."""
        if self._certainly_absent(st, st.request.block_hashes[start]):
            self.counters["presence_misses"] += 1
            return 0
        hashes = st.request.block_hashes[start:stop]
        if self.settings.async_lookups:
            try:
                if self.settings.query_control:
                    # TP lookups go through a Python thread (it needs the GIL to run).
                    if self._lookups is None:
                        self._lookups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orbitkv-lookup")
                    st.pending = self._lookups.submit(self._lookup_call, st.salt, list(hashes))
                else:
                    # The client's own native thread: no GIL, no Python code while it waits.
                    st.pending = self.session.client().start_lookup(self.session.namespace(st.salt), hashes)
            except Exception as exc:
                self._lookup_failed(exc)
                return 0
            st.pending_since = time.perf_counter()
            self.counters["async_lookups"] += 1
            if self._wait_for_answer(st):
                return self._collect(st)
            return None
        t0 = time.perf_counter()
        try:
            lease = self._lookup_call(st.salt, hashes)
        except Exception as exc:
            self._lookup_failed(exc)
            return 0
        self.lookup_seconds += time.perf_counter() - t0
        return self._take(st, lease, len(hashes))

    def _wait_for_answer(self, st: _ReqState) -> bool:
        """Wait for `st`'s background lookup within what is left of this step's budget
        (orbitkv.lookup_wait_us): True if it answered, so the hit is taken this step
        instead of the next."""
        fut = st.pending
        if fut is None or self._wait_left <= 0.0:
            return False
        t0 = time.perf_counter()
        if isinstance(fut, Future):
            done = bool(wait_futures([fut], timeout=self._wait_left).done)
        else:
            done = fut.wait(self._wait_left)
        self._wait_left = max(0.0, self._wait_left - (time.perf_counter() - t0))
        if done:
            self.counters["lookups_answered_in_step"] += 1
        return done

    def _collect(self, st: _ReqState) -> int | None:
        """The answer of `st`'s background lookup if it completed (None: not yet)."""
        fut = st.pending
        if fut is None or not fut.done():
            return None
        st.pending = None
        try:
            lease = fut.result()
        except Exception as exc:
            self._lookup_failed(exc)
            return 0
        self.lookup_seconds += time.perf_counter() - st.pending_since  # start to answer taken
        stop = min(len(st.request.block_hashes), (st.request.num_tokens - 1) // self.block_size)
        return self._take(st, lease, stop - st.lease_start)

    def _orphan(self, st: _ReqState) -> None:
        """`st` no longer wants its background lookup: release its lease when it lands."""
        if st.pending is not None:
            self._orphans.append(st.pending)
            st.pending = None
            self.counters["stale_lookups"] += 1
        self._reap_orphans()

    def _reap_orphans(self) -> None:
        if not self._orphans:
            return
        keep: list[PendingLookup | Future[Lease | TpLease]] = []
        for fut in self._orphans:
            if not fut.done():
                keep.append(fut)
                continue
            try:
                lease = fut.result()
            except Exception:
                continue  # failed: it pinned nothing
            self.counters["lookups"] += 1  # answered, just too late to be used
            self._release_lease(lease)
        self._orphans = keep

    # ---- vLLM scheduler-side hooks -------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self._state(request)

    def may_load_async(self, request: Request) -> bool:
        """Whether `request` may load from OrbitKV (vLLM 0.34, asked only with
        `--max-num-inflight-kv-loads`, when the request enters the waiting queues): then
        vLLM may look it up and start its load while the running batch is full, so its KV
        is in place when a slot frees. True unless OrbitKV does not serve it or the
        presence table (no message) says its first block is certainly absent; a request
        whose prefix the engine holds itself gets its answer at the lookup (a miss)."""
        st = self._state(request)
        if st.bypass is not None or not self.settings.loads:
            return False
        if (request.kv_transfer_params or {}).get("do_remote_prefill"):
            return False  # another connector owns this request's incoming KV (V5)
        if (request.num_tokens - 1) // self.block_size < 1 or not request.block_hashes:
            return False  # no complete block OrbitKV could serve
        return not self._certainly_absent(st, request.block_hashes[0])

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        st = self._state(request)
        start = num_computed_tokens // self.block_size
        st.local_hit_blocks = start
        if st.bypass is not None or not self.settings.loads or st.loading:
            return 0, False
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            return 0, False  # another connector owns this request's incoming KV (V5)
        stop = min(len(request.block_hashes), (request.num_tokens - 1) // self.block_size)
        if start >= stop:
            # The engine holds every block it may reuse: no Manager query (O5).
            self._orphan(st)
            self._release(st)
            st.lease_start = start
            return 0, False
        self._reap_orphans()
        if st.lease_start != start or st.preemptions != request.num_preemptions:
            # First query for this request, or its native hit moved, or it was
            # preempted (its blocks were freed): one lookup.
            st.preemptions = request.num_preemptions
            self._orphan(st)
            self._release(st)
            st.lease_start = start
            if self._lookup(st, start, stop) is None:
                return None, False  # vLLM: ask again next step
        elif st.pending is not None and self._collect(st) is None:
            return None, False  # still in flight
        hit = st.hit_blocks
        return hit * self.block_size, hit > 0

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        st = self._state(request)
        if st.loading:
            return
        if st.load_done:
            st.load_done = False  # second call, after the async load completed
            return
        if num_external_tokens == 0:
            if st.lease is not None:
                self.counters["unselected_leases"] += 1
                self._release(st)  # unselected query lease (L1)
            st.save_from = st.local_hit_blocks
            return
        if (
            st.lease is None
            or num_external_tokens % self.block_size
            or num_external_tokens > st.hit_blocks * self.block_size
        ):
            raise AssertionError(
                f"orbitkv: vLLM selected {num_external_tokens} external tokens for "
                f"{request.request_id} but the lookup pinned {st.hit_blocks} blocks"
            )
        # vLLM may take a shorter prefix of the hit than offered; load exactly that.
        start, n = st.lease_start, num_external_tokens // self.block_size
        block_ids = blocks.get_block_ids()[0][start : start + n]
        if len(block_ids) != n:
            raise AssertionError(f"orbitkv: {request.request_id} has {len(block_ids)} blocks for a {n}-block load")
        self._pending_loads.append(
            LoadSpec(
                req_id=request.request_id,
                salt=st.salt,
                hashes=tuple(request.block_hashes[start : start + n]),
                block_ids=tuple(block_ids),
                token=token_of(st.lease),
            )
        )
        st.loading = True
        st.load_block_ids = tuple(block_ids)
        self.counters["loads_started"] += 1

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> OrbitKVConnectorMetadata:
        self._wait_left = self.settings.lookup_wait_us / 1e6  # the next step's wait budget
        preempted = tuple(sorted(scheduler_output.preempted_req_ids or ()))
        meta = OrbitKVConnectorMetadata(loads=self._pending_loads, epoch=self._epoch, preempted=preempted)
        self._pending_loads = []
        for req_id in preempted:
            st = self._reqs.get(req_id)
            if st is not None:
                # Its blocks were freed: saves still reading them are ordered before their
                # reuse by the workers' handle_preemptions, and no longer hold its finish.
                # (The worker drops the request from its own bookkeeping in the same order.)
                st.saving = False
            if st is not None and not st.loading:
                self._release(st)
                st.lease_start = -1  # resumed requests look up again from their new hit
        block_state = scheduler_output.kv_connector_block_state
        if block_state is None:
            return self._close_save_batch(meta)
        # Runs for every scheduled request every step: most decode steps complete no
        # block, so the common path is one division and two comparisons.
        reqs, block_size = self._reqs, self.block_size
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            st = reqs.get(req_id)
            if st is None or st.bypass is not None:
                continue
            request = st.request
            # build_connector_meta runs before vLLM advances num_computed_tokens.
            complete = (request.num_computed_tokens + num_new) // block_size
            start = st.saved_upto if st.saved_upto > st.save_from else st.save_from
            if complete <= start:
                continue
            complete = min(complete, len(request.block_hashes))
            if complete <= start:
                continue
            group_ids = block_state.get_block_ids(req_id)
            if group_ids is None:
                continue
            block_ids = group_ids[0][start:complete]
            if len(block_ids) != complete - start:
                continue
            meta.saves.append(
                SaveSpec(
                    req_id=req_id,
                    salt=st.salt,
                    hashes=tuple(request.block_hashes[start:complete]),
                    block_ids=tuple(block_ids),
                )
            )
            st.saved_upto = complete
            st.saving = self.async_saves
            self.counters["save_blocks_planned"] += complete - start
        return self._close_save_batch(meta)

    def _close_save_batch(self, meta: OrbitKVConnectorMetadata) -> OrbitKVConnectorMetadata:
        """Number this step's saves (if any) as one batch whose completion is awaited."""
        if meta.saves:
            meta.save_batch = self._next_batch
            self._pending_save_batches.add(self._next_batch)
            self._next_batch += 1
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        failed = connector_output.failed_recving or set()
        invalid = connector_output.invalid_block_ids or set()
        for req_id in connector_output.finished_recving or ():
            st = self._reqs.get(req_id)
            if st is None or not st.loading:
                continue  # another connector's transfer (MultiConnector) or unknown
            st.loading = False
            self._release(st)  # the load has drained: unpin the source (L2)
            if req_id in failed:
                # vLLM recomputes (or fails) the whole request; its next pass is fresh.
                self.counters["loads_failed"] += 1
                st.save_from = st.local_hit_blocks
            else:
                bad = [i for i, b in enumerate(st.load_block_ids) if b in invalid]
                valid = bad[0] if bad else len(st.load_block_ids)
                if bad:
                    self.counters["loads_failed"] += 1
                else:
                    self.counters["loads_finished"] += 1
                st.load_done = True
                st.save_from = st.lease_start + valid
            if st.finished:
                del self._reqs[req_id]
        for req_id in connector_output.finished_sending or ():
            self._sending.discard(req_id)  # its saves completed: vLLM frees the blocks now
        wm = connector_output.kv_connector_worker_meta
        if isinstance(wm, OrbitKVWorkerMetadata):
            self._pending_save_batches -= wm.saved_batches
            self.counters["saved_blocks"] += wm.stored_blocks
            self.counters["refused_blocks"] += wm.refused_blocks
            self.counters["failed_saves"] += wm.failed_saves

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.get(request.request_id)
        if st is None:
            return False, None
        self._orphan(st)
        if st.hint is not None:
            self._send_hint(st)
        if st.loading:
            # Aborted mid-load: vLLM keeps the destination blocks until the worker
            # reports this id in finished_recving; the lease stays pinned until then.
            st.finished = True
            return False, None
        self._release(st)
        del self._reqs[request.request_id]
        if st.saving:
            # Saves planned from these blocks may still be copying (asynchronous saves):
            # vLLM frees them when every worker reports this id in finished_sending. The
            # workers decide with the same rule (a SaveSpec since the last preemption).
            self._sending.add(request.request_id)
            self.counters["delayed_frees"] += 1
            return True, None
        return False, None

    def reset_cache(self) -> bool:
        """External reset (L5): a fresh generation, refused while any owner is tracked."""
        owners = {
            "requests": len(self._reqs),
            "leases": sum(1 for s in self._reqs.values() if s.lease is not None),
            "loads": sum(1 for s in self._reqs.values() if s.loading),
            "lookups": sum(1 for s in self._reqs.values() if s.pending is not None) + len(self._orphans),
            "saves": len(self._pending_save_batches),
            "sending": len(self._sending),
        }
        if any(owners.values()):
            logger.warning("orbitkv: external reset refused, owners still tracked: %s", owners)
            return False
        try:
            # A generation belongs to the fingerprint: one reset moves every salt's
            # namespace (the Manager refuses with Busy while any owner lives on it).
            self.session.reset_generation()
        except Exception as exc:  # Busy or an unreachable Manager: report failure
            self.counters["manager_errors"] += 1
            logger.warning("orbitkv: external reset failed: %s", exc)
            if not is_error(exc, "Busy"):
                self.session.drop_client()
            return False
        self.session.forget_namespaces()
        self._epoch += 1
        self.counters["resets"] += 1
        return True

    def hit_tiers(self, request: Request, num_external_tokens: int) -> tuple[int, int]:
        """(DRAM, SSD) split of the `num_external_tokens` planned for loading `request`:
        the first blocks of its lease's hit, with the blocks the Manager held on SSD only
        at lookup time (`Lease.ssd_blocks`) counted as SSD. (0, 0) without a lease."""
        st = self._reqs.get(request.request_id)
        if st is None or st.lease is None or num_external_tokens <= 0:
            return 0, 0
        n = num_external_tokens // self.block_size
        ssd = sum(1 for i in st.lease.ssd_blocks if i < n) * self.block_size
        return num_external_tokens - ssd, ssd

    def connector_stats(self) -> OrbitKVConnectorStats | None:
        """Counter increments since the last call (vLLM's `get_kv_connector_stats`)."""
        return self._stats.take(self.counters, lookup_seconds=self.lookup_seconds)

    @property
    def tracked_requests(self) -> int:
        return len(self._reqs)

    @property
    def sending_requests(self) -> int:
        """Finished requests whose blocks wait for finished_sending."""
        return len(self._sending)

    def shutdown(self) -> None:
        for st in list(self._reqs.values()):
            self._orphan(st)
            if not st.loading:
                self._release(st)
        if self._lookups is not None:
            self._lookups.shutdown(wait=True)  # in-flight lookups end (answer or timeout)
        self._reap_orphans()
        self.session.close()
